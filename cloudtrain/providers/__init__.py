"""The providers: ``base.py`` (the interface every provider implements, and what they share), and one folder per
provider, each the whole of that provider (see cloudtrain/registry.py for the roles its modules play).

No provider folder imports another; the core reaches them only through the registry."""

from cloudtrain.registry import get_provider

__all__ = ["get_provider"]
