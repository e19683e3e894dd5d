"""The providers: ``base.py`` (the interface every provider implements, and what they share), and one folder per
provider, each the whole of that provider (see cloudtrain/registry.py for the roles its modules play).

No provider folder imports another; the core reaches them only through the registry."""

from __future__ import annotations

from typing import Any

from cloudtrain import registry
from cloudtrain.job_types import JobStatus
from cloudtrain.providers.base import Provider

__all__ = ["get_provider"]


def get_provider(name: str) -> Provider:
    """The provider ``name``, found through the registry (its extra checked installed)."""
    found: Provider = registry.get_provider(name)
    return found


def _setting(provider: str, key: str, explicit: Any = None) -> Any:
    from cloudtrain.spec.settings import lookup

    return lookup(provider, key, explicit)


def _observe(status: JobStatus) -> None:
    from cloudtrain.home import timeline

    timeline.observe(status)


Provider.settings_resolver = _setting  # the one resolver, for what providers do outside a plan
Provider.observe = _observe  # each status a provider describes goes into the job's timeline
Provider.declared = registry.declaration  # a provider class that states only its name finds its declaration here
