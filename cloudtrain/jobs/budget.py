"""A budget that holds: the watcher's part of ``max_cost``, and ``cloudtrain cost HANDLE``.

The watcher (cloudtrain/jobs/recovery.py while it waits, a foreground submit while it follows the logs) prices the job's
chain of legs at every status poll (cloudtrain/plan/cost.py). When the cost accrued across all legs and restarts reaches
``max_cost`` it stops the running leg with the provider's ``cancel`` (local: SIGTERM to every node, which saves a final
checkpoint and exits; SageMaker: StopTrainingJob, SIGTERM then 120 s; Azure ML and Vertex: their cancel), and never
resubmits after that. The stop is recorded beside the root's price (``stopped``), so ``status`` and a watcher started
later say so too. (`cloudtrain cost` and the status note are in cloudtrain/sdk.py: they read the recovery chain,
which imports this module.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError
from cloudtrain.handles import JobHandle
from cloudtrain.node.durations import format_duration
from cloudtrain.plan import cost

if TYPE_CHECKING:
    from cloudtrain.job_types import JobStatus
    from cloudtrain.providers.base import Provider


class Watcher:
    """The budget of one chain of legs (``chain`` is the recovery's own list: it grows as legs are added)."""

    def __init__(self, chain: list[str], log: Callable[[str], None] = print) -> None:
        self.chain = chain
        self.log = log
        self.record = cost.recorded(chain[0]) or {}
        self.max_cost: float | None = self.record.get("max_cost")
        self.stopped: str | None = self.record.get("stopped")
        self._ended: dict[str, cost.Leg] = {}  # legs that ended do not change: described once
        self._lock = threading.Lock()
        self._cancelled = False

    def legs(self, current: JobStatus | None = None) -> list[cost.Leg]:
        """Every leg as it stands (``current``: the newest leg's status, already read)."""
        root_rate = cost.rate_from(self.record)
        legs = []
        for handle in self.chain:
            if handle in self._ended:
                legs.append(self._ended[handle])
                continue
            status = current if current is not None and str(current.handle) == handle else _describe(handle)
            rate = cost.rate_from(cost.recorded(handle)) if handle != self.chain[0] else root_rate
            leg = cost.Leg(handle, status.started_at, status.ended_at, rate or root_rate, status.state.value,
                           status.restarts or 0)
            if status.state.terminal:
                self._ended[handle] = leg
            legs.append(leg)
        return legs

    def spent(self, current: JobStatus | None = None) -> cost.Accrued:
        return cost.accrued(self.legs(current))

    def reached(self, current: JobStatus | None = None) -> bool:
        """Whether the budget is spent (recording and saying so the first time)."""
        if self.max_cost is None:
            return False
        if self.stopped:
            return True
        try:
            total = self.spent(current)
        except CloudtrainError:  # an older leg's status could not be read now: the next poll prices it
            return False
        if total.cost < self.max_cost:
            return False
        self.stopped = (f"stopped: budget USD {self.max_cost:,.2f} reached after {format_duration(total.hours * 3600)}"
                        f" ({len(total.legs)} leg(s), {total.restarts} restart(s), USD {total.cost:,.2f} accrued at "
                        "list prices); a final checkpoint was asked for and the job is not resubmitted")
        cost.write(self.chain[0], {**self.record, "stopped": self.stopped})
        self.log(self.stopped)
        return True

    def poll(self, provider: Provider, status: JobStatus) -> None:
        """At a status poll of the running leg: stop it once the budget is spent (its final checkpoint follows)."""
        with self._lock:
            if status.state.terminal or not self.reached(status):
                return
            if not self._cancelled:
                self._cancelled = True
                provider.cancel(status.handle)

    def follow(self, provider: Provider, current: Callable[[], JobHandle], every: float) -> threading.Event:
        """Poll in a thread while logs stream (a foreground submit); set the returned event to end it."""
        done = threading.Event()

        def run() -> None:
            from cloudtrain.providers import get_provider

            while not done.wait(every):
                handle = current()  # a fallback may have moved the job to another provider since the last poll
                impl = provider if handle.provider == provider.name else get_provider(handle.provider)
                try:
                    self.poll(impl, impl.describe(handle))
                except CloudtrainError:  # a status that could not be read now: the next poll tries again
                    continue

        threading.Thread(target=run, name="cloudtrain-budget", daemon=True).start()
        return done


def watcher(chain: list[str], log: Callable[[str], None] = print) -> Watcher | None:
    """The chain's budget watcher, or None when the job has no max_cost."""
    found = Watcher(chain, log)
    return found if found.max_cost is not None else None


def _describe(handle: str) -> JobStatus:
    from cloudtrain.providers import get_provider

    parsed = JobHandle.parse(handle)
    return get_provider(parsed.provider).describe(parsed)
