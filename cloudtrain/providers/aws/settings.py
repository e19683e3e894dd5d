"""Where an AWS setting comes from when neither the spec, the environment nor cloudtrain's profile sets it."""

from __future__ import annotations

from typing import Any


def platform_setting(key: str) -> tuple[Any, str] | None:
    """The region of the AWS profile (~/.aws/config, read by botocore offline); nothing else is read there."""
    if key != "region":
        return None
    try:
        import botocore.session
    except ImportError:
        return None
    value = botocore.session.get_session().get_config_variable("region")
    return (value, "aws profile (~/.aws/config)") if value else None
