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
    if status.state.terminal:
        _learn(status)


_learning: set[str] = set()  # the handles being learned in this process: a provider's logs may describe the job


def _learn(status: JobStatus) -> None:
    """A job seen ended for the first time: what its run measured (checkpoints and the time they blocked, paid
    time, preemptions: cloudtrain/home/goodput.py) is kept for the next plan of ``checkpoint.interval: auto``, under
    the provider, machine, nodes, spot and name its ``submitted`` event names (cloudtrain/home/measured.py). Once per
    handle; best effort: describe goes on whatever happens here."""
    import sys

    from cloudtrain.errors import CloudtrainError
    from cloudtrain.home import goodput, measured, timeline

    handle = str(status.handle)
    key = measured.key_of(timeline.own_events(handle)[0])
    if key is None or handle in _learning or measured.known(key, handle):  # none: submitted by an older cloudtrain
        return
    _learning.add(handle)
    try:
        try:
            found = timeline.read(registry.get_provider(status.handle.provider), status.handle)
        except CloudtrainError:  # the provider cannot be loaded here now: the next describe that can learns it
            return
        if found["logs"] is not None:  # the nodes' events are not known now (logs not read): learned later
            return
        try:
            figures = measured.sound(goodput.summarise(found["events"], status)["goodput"])
        except (ValueError, TypeError, ArithmeticError):  # event fields a hand wrote (a string, 1e999 steps)
            figures = None
        measured.remember(key, handle, figures)
    except Exception as exc:  # a bug of cloudtrain's: said, and describe goes on
        print(f"cloudtrain: warning: could not keep what {handle} measured for checkpoint.interval auto "
              f"({type(exc).__name__}: {exc}); please report it", file=sys.stderr)
    finally:
        _learning.discard(handle)


Provider.settings_resolver = _setting  # the one resolver, for what providers do outside a plan
Provider.observe = _observe  # each status a provider describes goes into the job's timeline
Provider.declared = registry.declaration  # a provider class that states only its name finds its declaration here
