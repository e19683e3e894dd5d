"""Exponential backoff with jitter, on a clock that can be simulated (recovery's waits; the goodput benchmark
replays a day of them without sleeping)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...  # seconds since the epoch (persisted in recovery state, so wall time)

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


SYSTEM = SystemClock()


@dataclass
class Backoff:
    """``delay(n)`` for the n-th consecutive failure (1-based): base * factor**(n-1), capped, with "equal jitter"
    (half fixed, half random) so that many watchers retrying the same outage do not call back in step."""

    base: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        ceiling = min(self.cap, self.base * self.factor ** max(0, min(attempt - 1, 60)))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)
