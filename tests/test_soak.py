"""Preemption soak, reduced for CI: a 2 nodes x 2 processes FSDP job interrupted by SIGTERM and SIGKILL during
steps, a save and an upload ends bitwise equal to an uninterrupted run, with no orphan process and nothing in its
checkpoint store beyond retention. The full soak (20+ interruptions): ``python benchmarks/soak.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import SoakConfig, run_soak

pytestmark = [pytest.mark.slow, pytest.mark.soak]  # `nox -s soak`

# Both kinds at the moments most likely to break something: a SIGKILL mid-upload (temp files, a manifest-less
# folder), a SIGTERM while a save is in flight (the final save waits for it), a SIGKILL right after a save started.
SCHEDULE = [("sigterm", "upload"), ("sigkill", "upload"), ("sigterm", "step"), ("sigkill", "save")]


@pytest.mark.timeout(480)
def test_soak_reduced(tmp_path: Path) -> None:
    # 32 steps: this schedule needs at most 4 x 9 of them; most of the time goes to the 5 starts of 4 processes
    config = SoakConfig(interruptions=len(SCHEDULE), schedule=SCHEDULE, seed=7, epochs=4, step_sleep=0.02, width=64)
    report = run_soak(tmp_path, config)
    print(report.text())
    assert not report.problems, report.text()
    assert len(report.interruptions) == len(SCHEDULE)
    assert report.restarts == 2 and report.resubmissions == 2
    assert report.checkpoints_lost == 0
