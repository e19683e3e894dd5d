"""Every benchmark still starts: its imports resolve and its options parse (``--help``), without running it.

plan_aws.py and plan_gcp.py imported a helper from cli_startup.py that a later change removed; nothing ran them, so
they stayed broken until someone needed the figure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if p.name != "installed.py")


def test_there_are_benchmarks() -> None:
    assert {"transfer.py", "local_job.py", "preemption.py", "cli_startup.py"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_starts(name: str) -> None:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
