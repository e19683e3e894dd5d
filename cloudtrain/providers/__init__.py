"""The providers: ``base.py`` (the interface every provider implements, and what they share), and one folder per
provider, each the whole of that provider (see cloudtrain/registry.py for the roles its modules play).

No provider folder imports another; the core reaches them only through the registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain import registry

if TYPE_CHECKING:
    from cloudtrain.providers.base import Provider

__all__ = ["get_provider"]


def get_provider(name: str) -> Provider:
    """The provider ``name``, found through the registry (its extra checked installed)."""
    found: Provider = registry.get_provider(name)
    return found
