"""Where a Google Cloud setting comes from when neither the spec, the environment nor cloudtrain's profile sets it."""

from __future__ import annotations

from typing import Any

from cloudtrain.providers.gcp.clients import DEFAULT_REGION, gcloud_setting


def platform_setting(key: str) -> tuple[Any, str] | None:
    """gcloud's own configuration (project, region), else cloudtrain's default region."""
    if key not in ("project", "region"):
        return None
    return gcloud_setting(key) or ((DEFAULT_REGION, "default") if key == "region" else None)
