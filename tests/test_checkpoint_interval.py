"""Issue 41.5: ``checkpoint.interval: auto``, the interval that keeps the most of a job's paid time as training
(Young/Daly: sqrt(2 x checkpoint cost x mean time between interruptions), held to a floor and max_runtime). The plan
says what it chose and why, and the nodes get that many seconds."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.plan.checkpoint_interval import FLOOR, auto_interval, choose
from tests.conftest import REPO, cli_env


def test_young_daly_within_its_bounds() -> None:
    assert choose(30, 3 * 3600, 24 * 3600) == int(math.sqrt(2 * 30 * 3 * 3600))  # 804 s
    assert choose(1, 60, 24 * 3600) == FLOOR  # never more often than a minute
    assert choose(600, 3600, 24 * 3600) == int(math.sqrt(2 * 600 * 3600))
    assert choose(200, 10, 24 * 3600) == 400  # at least twice the cost: half the time would go to checkpoints
    assert choose(30, 365 * 24 * 3600, 7200) == 7200  # never beyond max_runtime
    spot, on_demand = (auto_interval(spot=s, nodes=4, max_runtime=24 * 3600) for s in (True, False))
    assert spot.seconds < on_demand.seconds and not spot.measured  # four spot nodes are interrupted more often
    measured = auto_interval(spot=True, nodes=4, max_runtime=24 * 3600, cost=5.0, between=7200.0)
    assert measured.measured and measured.seconds == int(math.sqrt(2 * 5 * 7200)) and "measured" in measured.note()


def plan(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train.py", *flags], cwd=tmp_path,
                          env=cli_env(tmp_path / "home"), capture_output=True, text=True, timeout=120)


def test_the_plan_says_what_auto_chose_and_the_nodes_get_those_seconds(tmp_path: Path) -> None:
    done = plan(tmp_path, "-p", "gcp", "--gpus", "A100:8", "--nodes", "2", "--spot", "--checkpoint-uri",
                "gs://my-bucket/run", "--set", "checkpoint.interval=auto", "-o", "json")
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    chosen = auto_interval(spot=True, nodes=2, max_runtime=24 * 3600)
    assert planned["spec"]["checkpoint"]["interval"] == chosen.seconds
    assert any(n.startswith("checkpoint.interval auto: 13m") and "Young/Daly" in n for n in planned["notes"])
    assert f'"CLOUDTRAIN_CHECKPOINT_INTERVAL", "value": "{chosen.seconds}"' in json.dumps(planned["request"])


@pytest.mark.parametrize("value", ["automatic", "0", "-5m"])
def test_an_interval_that_is_neither_a_duration_nor_auto_is_refused(tmp_path: Path, value: str) -> None:
    done = plan(tmp_path, "-p", "local", "--checkpoint-uri", (tmp_path / "s").as_uri(), "--set",
                f"checkpoint.interval={value}")
    assert done.returncode == 2 and "checkpoint.interval" in done.stderr and "Traceback" not in done.stderr


def test_the_goodput_benchmark_compares_auto_with_fixed_intervals_in_one_run() -> None:
    bench = subprocess.run([sys.executable, "benchmarks/goodput.py", "--seeds", "3"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    assert any(line.startswith("fallback, auto") and "measured" in line for line in bench.stdout.splitlines())
    ratio = next(line for line in bench.stdout.splitlines() if line.startswith("auto (measured) / fixed 10m"))
    assert "goodput x" in ratio and "cost vs on-demand" in ratio, bench.stdout


def test_auto_with_a_stacks_own_checkpoints_says_the_stack_decides_instead_of_announcing_one(tmp_path: Path) -> None:
    """Issue 50.7: with checkpoint.dir the stack saves on its own schedule (save_steps), so an interval cloudtrain
    announced was one nothing followed. The plan says the stack decides and what to set there; no node gets one."""
    done = plan(tmp_path, "-p", "local", "--checkpoint-uri", (tmp_path / "s").as_uri(), "--checkpoint-dir", "out",
                "--set", "checkpoint.interval=auto", "-o", "json")
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert planned["spec"]["checkpoint"].get("interval") is None
    note = next(n for n in planned["notes"] if n.startswith("checkpoint.interval auto:"))
    assert "stack decides when it saves" in note and "save_steps" in note, note
    assert "CLOUDTRAIN_CHECKPOINT_INTERVAL" not in json.dumps(planned["request"])
