"""One real local job for the timeline and report tests (tests/test_timeline.py, tests/test_report.py): trains with
a price (the report draws cost), is preempted (`cloudtrain preempt`) after its first checkpoints, restarts from its
newest checkpoint and succeeds. Session-scoped, and its tests (marked READS_IT) run on one xdist worker, so the
~40 s job runs once per suite run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # conftest loads this module under Python 3.8 too (nox -s bootstrap): nothing subscripted at run time
    from collections.abc import Callable, Iterator
    from subprocess import CompletedProcess

    Cli = Callable[..., CompletedProcess[str]]
# pytest-xdist: the tests that read the one job (session-scoped, so once per worker) run on one worker, in turn
READS_IT = pytest.mark.xdist_group("preempted-job")
EPOCHS = 3
STEPS = EPOCHS * 32  # 2048 samples, 2 ranks, batch 32
# 0.1 s a step: ~10 s of training, the preemption coming after the second checkpoint (step 20) with ~7 s to spare; at
# 0.03 s a loaded machine's status polls let a 2-epoch job end before the preemption came (no training_again)
STEP_SLEEP = "0.1"


@pytest.fixture(scope="session")
def preempted_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, str, Path]]:
    from cloudtrain.testing.fixtures import ddp_project, stop_every_job
    from tests.conftest import cli_env, status_json, wait_for

    tmp = tmp_path_factory.mktemp("preempted-job")
    home = tmp / "ct-home"

    def cli(*args: str) -> CompletedProcess[str]:
        env = {**cli_env(home), "CLOUDTRAIN_CONFIG": str(tmp / "none.yaml"), "CLOUDTRAIN_STEP_REPORT_SECONDS": "0.3"}
        env.pop("CLOUDTRAIN_PROFILE", None)
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=tmp, env=env, capture_output=True,
                              text=True, timeout=240)

    proj = ddp_project(tmp)
    out = cli("submit", str(proj / "train_ddp.py"), "--procs-per-node", "2", "--max-restarts", "1", "--spot",
              "--set", "providers.local.price_per_node_hour=3.5",
              "--checkpoint-uri", (tmp / "ckpt").as_uri(), "--detach", "--", "--epochs", str(EPOCHS),
              "--checkpoint-every", "10", "--step-sleep", STEP_SLEEP)
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip().splitlines()[-1]
    wait_for(lambda: (status_json(cli, handle)["goodput"]["checkpoints"] or 0) >= 2, timeout=90)
    assert cli("preempt", handle).returncode == 0
    assert cli("wait", handle, "--timeout", "120").returncode == 0
    yield cli, handle, home
    stop_every_job(home)
