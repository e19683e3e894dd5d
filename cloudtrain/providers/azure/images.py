"""The Azure ML curated environments cloudtrain picks, from this folder's images.json (dated; docs/images.md)."""

from __future__ import annotations

from cloudtrain.platforms import images


def offered_minors() -> list[str]:
    """The torch minors an environment is known for."""
    return list(images.table("azure")["environments"])
