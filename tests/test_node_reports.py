"""Failures that look like success, and scripts that cannot run here: hollow runs (no process group), GPU-only
scripts on a CPU machine, and hangs (the max_idle watchdog). Real torchrun jobs through the local provider; the
watchdog also under a cloud platform's environment contract (the same bootstrap a cloud node runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, status_json

pytestmark = pytest.mark.slow
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # the bootstrap counts no GPU, whatever this machine has


def script(tmp_path: Path, name: str) -> str:
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / name).write_text((SCRIPTS / name).read_text())
    return str(proj / name)


def submit(cli, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    handle = cli("submit", "--detach", *args, env_extra=env).stdout.strip()
    assert handle.startswith("local://"), handle
    waited = cli("wait", handle, "--timeout", "240", env_extra=env)
    return waited.returncode, status_json(cli, handle)


def test_a_hollow_run_says_each_process_trained_alone(cli, tmp_path: Path) -> None:
    """17.9: a script that never initialises torch.distributed was reported as a plain `succeeded`."""
    code, status = submit(cli, script(tmp_path, "hollow.py"), "--nodes", "2", "--procs-per-node", "2")
    assert code == 0 and status["state"] == "succeeded"
    assert status["message"] == "4 processes ran, none joined a process group: each trained alone"
    for node in status["nodes"]:
        assert node["note"] == "2 processes ran, none joined a process group: each trained alone"
        assert node["ranks"]["no_group"] == 2 and node["ranks"]["world_size"] == 4


def test_a_real_ddp_run_is_not_called_hollow(cli, tmp_path: Path) -> None:
    """plain_torchrun.py joins (and destroys) its process group before exit: each rank reports a group of 4."""
    from tests.conftest import REPO

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "plain_torchrun.py").write_text((REPO / "entrypoints" / "plain_torchrun.py").read_text())
    code, status = submit(cli, str(proj / "plain_torchrun.py"), "--nodes", "2", "--procs-per-node", "2")
    assert code == 0 and status["state"] == "succeeded" and status["message"] == ""
    assert [n["ranks"]["joined"] for n in status["nodes"]] == [[4], [4]]
    assert all("note" not in n for n in status["nodes"])


@pytest.mark.parametrize("use_cpu", [False, True])
def test_accelerate_falling_back_to_one_process_is_reported(cli, tmp_path: Path, use_cpu: bool) -> None:
    """17.9: Accelerate without ACCELERATE_USE_CPU printed `DistributedType.NO / Num processes: 1` on every rank and
    the job read `succeeded`; with it, the same script joins one group of 2 and nothing is said."""
    env = {**NO_GPU, **({"ACCELERATE_USE_CPU": "1"} if use_cpu else {})}
    flags = ["--env", "ACCELERATE_USE_CPU=1"] if use_cpu else []
    code, status = submit(cli, script(tmp_path, "accelerate_state.py"), "--procs-per-node", "2", *flags, env=env)
    assert code == 0 and status["state"] == "succeeded"
    log = Path(status["nodes"][0]["log"]).read_text()
    if use_cpu:
        assert "distributed_type=MULTI_CPU num_processes=2" in log and status["message"] == ""
    else:  # Accelerate creates the group, then runs each process alone and never uses it
        assert log.count("distributed_type=NO num_processes=1") == 2
        assert status["message"] == ("2 processes ran and joined a process group of 2, but none communicated over "
                                     "it (no collective ran; a framework that fell back to one process?): each "
                                     "trained alone")


def test_a_gpu_script_that_dies_on_cuda_says_why_and_the_fix(cli, tmp_path: Path) -> None:
    """17.10: ddp-tutorial-series/multinode.py's pattern failed with only 'node 0 failed with exit code 1'."""
    code, status = submit(cli, script(tmp_path, "gpu_setdevice.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 1 and status["state"] == "failed"
    message = status["message"]
    assert message.startswith("node 0 failed with exit code 1: local rank 0 needs a GPU and this machine has none")
    assert "no attribute '_cuda_setDevice'" in message
    assert "GPU provider" in message and "cloudtrain.runtime.init_distributed()" in message


def test_a_gpu_script_that_exits_0_having_done_nothing_says_so(cli, tmp_path: Path) -> None:
    """17.10: distributed/ddp/example.py's pattern printed 'Unable to locate sufficient 2 gpus', exited 0 and was
    reported as succeeded."""
    code, status = submit(cli, script(tmp_path, "gpu_count_check.py"), "--procs-per-node", "2", env=NO_GPU)
    assert status["state"] == "succeeded" and code == 0
    message = status["message"]
    assert message.startswith("2 processes ran, none joined a process group: each trained alone; node 0: ")
    assert "'Unable to locate sufficient 2 gpus to run this example. Exiting.'" in message
    assert "cloudtrain.runtime.init_distributed()" in message


def test_a_failure_names_the_exception(cli, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "raises.py").write_text("import os\nif os.environ['LOCAL_RANK'] == '0':\n"
                                    "    raise ValueError('bad learning rate: -1')\n")
    code, status = submit(cli, str(proj / "raises.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 1
    assert status["message"] == "node 0 failed with exit code 1: local rank 0: ValueError: bad learning rate: -1"


@pytest.mark.parametrize("emulate", ["local", "sagemaker"])
def test_the_watchdog_stops_a_hung_job(cli, tmp_path: Path, emulate: str) -> None:
    """17.11: a job that hung ran forever. With max_idle it is stopped, and says why; the bootstrap does it, so it
    works under a cloud platform's contract too (here SageMaker's, emulated)."""
    extra = ["--emulate", emulate] if emulate != "local" else []
    code, status = submit(cli, script(tmp_path, "hangs.py"), "--procs-per-node", "2", "--max-idle", "8s", *extra)
    assert code == 1 and status["state"] == "failed"
    assert status["message"].startswith("node 0 failed with exit code 1: no output and no checkpoint for 8s "
                                        "(max_idle): stopped as hung"), status["message"]
    log = Path(status["nodes"][0]["log"]).read_text()
    assert "[cloudtrain] stopping this node: no output and no checkpoint for 8s" in log


def test_the_watchdog_leaves_a_busy_job_alone(cli, tmp_path: Path) -> None:
    """Only rank 0 prints: node 1's silence is not a hang (the node of rank 0 is the one that watches)."""
    code, status = submit(cli, script(tmp_path, "chatty.py"), "--nodes", "2", "--procs-per-node", "1",
                          "--max-idle", "10s", "--", "14")
    assert code == 0 and status["state"] == "succeeded", status


def test_max_idle_reaches_the_node_environment(cli, tmp_path: Path) -> None:
    planned = cli("plan", script(tmp_path, "hangs.py"), "--max-idle", "10m", "-o", "json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["spec"]["max_idle"] == 600 and plan["nodes"][0]["env"]["CLOUDTRAIN_MAX_IDLE"] == "600"
    aws = cli("plan", script(tmp_path, "hangs.py"), "-p", "aws", "--gpus", "A10G:1", "--max-idle", "10m", "--set",
              "providers.aws.region=us-east-1", "--set", "providers.aws.role=arn:aws:iam::123456789012:role/x",
              "-o", "json")
    assert aws.returncode == 0, aws.stderr
    assert json.loads(aws.stdout)["request"]["Environment"]["CLOUDTRAIN_MAX_IDLE"] == "600"  # a cloud node too
