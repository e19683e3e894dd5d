"""Where an Azure setting comes from when neither the spec, the environment nor cloudtrain's profile sets it."""

from __future__ import annotations

from typing import Any

from cloudtrain.providers.azure.workspace import config_json


def platform_setting(key: str) -> tuple[Any, str] | None:
    """The workspace's config.json (here or in a parent folder), as the Azure ML tools find it."""
    if key not in ("subscription_id", "resource_group", "workspace"):
        return None
    found = config_json()
    if not found:
        return None
    data, where = found
    value = data.get("workspace_name" if key == "workspace" else key)
    return (value, f"azure {where}") if value else None
