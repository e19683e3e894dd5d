"""Failures that look like success, and scripts that cannot run here: hollow runs (no process group), GPU-only
scripts on a CPU machine, and hangs (the max_idle watchdog). Real torchrun jobs through the local provider; the
watchdog also under a cloud platform's environment contract (the same bootstrap a cloud node runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, SCRIPTS, status_json

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
    assert status["message"].startswith("4 processes ran, none joined a process group: each trained alone; node 0: "
                                        "the script never joined the job's process group: call torch.distributed."
                                        "init_process_group()"), status["message"]
    assert status["message"].endswith("(--require-process-group makes such a run fail)")
    for node in status["nodes"]:
        assert node["note"] == "2 processes ran, none joined a process group: each trained alone"
        assert node["ranks"]["no_group"] == 2 and node["ranks"]["world_size"] == 4


def test_a_real_ddp_run_is_not_called_hollow(cli, tmp_path: Path) -> None:
    """plain_torchrun.py joins (and destroys) its process group before exit: each rank reports a group of 4."""
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
        assert status["message"].startswith(
            "2 processes ran and joined a process group of 2, but none communicated over it (no collective ran; a "
            "framework that fell back to one process?): each trained alone; node 0: Accelerate runs each process on "
            "its own on a machine without GPUs unless told to use the CPU: submit with --env ACCELERATE_USE_CPU=1")


def test_a_gpu_script_that_dies_on_cuda_says_why_and_the_fix(cli, tmp_path: Path) -> None:
    """17.10: ddp-tutorial-series/multinode.py's pattern failed with only 'node 0 failed with exit code 1'."""
    code, status = submit(cli, script(tmp_path, "gpu_setdevice.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 1 and status["state"] == "failed"
    message = status["message"]
    # whichever rank died first (torchrun then stops the other before it prints anything)
    assert re.match(r"node 0 failed with exit code 1: local rank [01] needs a GPU and this machine has none", message)
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


@pytest.mark.parametrize("cpu", [False, True])
def test_accelerates_partial_state_ignores_accelerate_use_cpu_and_the_hint_says_so(cli, tmp_path: Path,
                                                                                   cpu: bool) -> None:
    """29.4: Accelerate's own test scripts ran alone with --env ACCELERATE_USE_CPU=1, and the hint said to set it."""
    code, status = submit(cli, script(tmp_path, "accelerate_partial_state.py"), "--procs-per-node", "2", "--env",
                          "ACCELERATE_USE_CPU=1", *(["--", "cpu"] if cpu else []), env=NO_GPU)
    assert code == 0 and status["state"] == "succeeded"
    if cpu:
        assert status["message"] == ""
    else:
        assert "Accelerate ran each process on its own although ACCELERATE_USE_CPU is set" in status["message"]
        assert "PartialState(cpu=True)" in status["message"]


def test_lightning_with_one_device_says_how_to_give_it_the_job(cli, tmp_path: Path) -> None:
    """29.4: Trainer(devices=1) under torchrun trains one whole model per process; the hint said it needed a GPU."""
    code, status = submit(cli, script(tmp_path, "lightning_one_device.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 0 and status["state"] == "succeeded"
    assert status["message"].startswith("2 processes ran, none joined a process group: each trained alone; node 0: "
                                        "PyTorch Lightning ran each process on its own"), status["message"]
    assert "Trainer(devices=2, num_nodes=1)" in status["message"] and "GPU provider" not in status["message"]


def test_require_process_group_fails_a_run_whose_processes_trained_alone(cli, tmp_path: Path) -> None:
    """29.4: for CI, a hollow run is a failure (exit 1) rather than a success with a note."""
    code, status = submit(cli, script(tmp_path, "hollow.py"), "--procs-per-node", "2", "--require-process-group")
    assert code == 1 and status["state"] == "failed"
    assert status["message"].startswith("node 0 failed with exit code 1: 2 processes ran, none joined a process "
                                        "group: each trained alone, and require_process_group is set: the script "
                                        "never joined"), status["message"]
    (tmp_path / "proj" / "plain_torchrun.py").write_text((REPO / "entrypoints" / "plain_torchrun.py").read_text())
    ok, fine = submit(cli, str(tmp_path / "proj" / "plain_torchrun.py"), "--procs-per-node", "2",
                      "--require-process-group")
    assert ok == 0 and fine["state"] == "succeeded" and fine["message"] == ""  # a real DDP run passes


def test_a_failure_after_init_process_group_names_the_first_exception(cli, tmp_path: Path) -> None:
    """29.1: torch prefixes a worker's traceback with [rankN]: once it joined a group, and the job read only 'node 0
    failed with exit code 1 (see its log)'. The rank that raised first is named (not rank 0, whose barrier then
    failed with 'Connection closed by peer'), with the exception its own came from."""
    code, status = submit(cli, script(tmp_path, "raises_after_init.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 1
    assert status["message"] == ("node 0 failed with exit code 1: local rank 1: RuntimeError: dataset not found at "
                                 "/nonexistent/train.bin (caused by FileNotFoundError: [Errno 2] No such file or "
                                 "directory: '/nonexistent/train.bin')")


def test_a_gpu_script_that_fails_after_joining_still_gets_the_gpu_hint(cli, tmp_path: Path) -> None:
    """29.1: nanoGPT's pattern (join with gloo, then pin a CUDA device) failed with the [rankN]: prefix: unnamed."""
    code, status = submit(cli, script(tmp_path, "gpu_after_init.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 1
    message = status["message"]
    assert message.startswith("node 0 failed with exit code 1: local rank "), message
    assert "needs a GPU and this machine has none" in message and "_cuda_setDevice" in message
    assert "cloudtrain.runtime.init_distributed()" in message


def test_a_failure_recorded_in_an_elastic_error_file_is_named_from_it(cli, tmp_path: Path) -> None:
    """29.1: a main wrapped in @record writes its exception to TORCHELASTIC_ERROR_FILE; a cleanup that raised at exit
    left the last traceback in stderr, which is not the one that failed the run."""
    code, status = submit(cli, script(tmp_path, "records_error.py"), "--procs-per-node", "2", env=NO_GPU)
    assert code == 1
    assert status["message"] == ("node 0 failed with exit code 1: local rank 0: ValueError: bad config: lr must be "
                                 "positive, got -1")


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
    assert status["message"].startswith("node 0 failed with exit code 1: no output, no checkpoint and no CPU use for "
                                        "8s (max_idle): stopped as hung"), status["message"]
    log = Path(status["nodes"][0]["log"]).read_text()
    assert "[cloudtrain] stopping this node: no output, no checkpoint and no CPU use for 8s" in log


def test_the_watchdog_stops_a_deadlocked_collective(cli, tmp_path: Path) -> None:
    """29.3: rank 0 waits in a gloo all_reduce that rank 1 never joins (a day's process-group timeout): a rank
    waiting in gloo uses no CPU, so the job is stopped as hung after max_idle, not at max_runtime."""
    code, status = submit(cli, script(tmp_path, "deadlocks.py"), "--procs-per-node", "2", "--max-idle", "8s")
    assert code == 1 and status["state"] == "failed", status
    assert "no output, no checkpoint and no CPU use for 8s (max_idle): stopped as hung" in status["message"], status


def test_the_watchdog_leaves_a_silent_computing_job_alone(cli, tmp_path: Path) -> None:
    """29.3: a script that computes for three times max_idle without printing or checkpointing is busy (its CPU
    time grows), not hung; before, it was stopped as hung. (One process on one core: two, or one on every core,
    took the CPU of a 2-core CI machine for 24 s, and test nothing more: any busy worker keeps the node alive.)"""
    code, status = submit(cli, script(tmp_path, "silent_busy.py"), "--procs-per-node", "1", "--max-idle", "8s",
                          "--", "24")
    assert code == 0 and status["state"] == "succeeded", status


def test_the_watchdog_leaves_a_busy_job_alone(cli, tmp_path: Path) -> None:
    """Only rank 0 prints: node 1's silence is not a hang (the node of rank 0 is the one that watches)."""
    code, status = submit(cli, script(tmp_path, "chatty.py"), "--nodes", "2", "--procs-per-node", "1",
                          "--max-idle", "10s", "--", "14")
    assert code == 0 and status["state"] == "succeeded", status


def test_the_watchdog_is_on_by_default_and_every_plan_says_so(cli, tmp_path: Path) -> None:
    """29.3: a deadlock ran 21 minutes unseen because max_idle was off unless set. Now 30m unless `off`, shown in
    the plan's summary and JSON, and in the spec `init` writes."""
    train = script(tmp_path, "hangs.py")
    shown = cli("plan", train)
    assert "stopped as hung after 30m without output, checkpoint or CPU use (max_idle)" in shown.stdout, shown.stdout
    plan = json.loads(cli("plan", train, "-o", "json").stdout)
    assert plan["spec"]["max_idle"] == 1800 and plan["nodes"][0]["env"]["CLOUDTRAIN_MAX_IDLE"] == "1800"
    off = cli("plan", train, "--max-idle", "off")
    assert "no hang watchdog (max_idle: off)" in off.stdout, off.stdout
    plan = json.loads(cli("plan", train, "--max-idle", "off", "-o", "json").stdout)
    assert plan["spec"]["max_idle"] == "off" and "CLOUDTRAIN_MAX_IDLE" not in plan["nodes"][0]["env"]
    (tmp_path / "proj" / "cloudtrain.yaml").write_text("script: hangs.py\nmax_idle: off\n")  # YAML reads off as false
    assert "no hang watchdog" in cli("plan", cwd=tmp_path / "proj").stdout
    from cloudtrain import Job

    with Job(script="hangs.py", source_dir=str(tmp_path / "proj")).plan("local") as planned:  # a notebook's table
        assert "stopped as hung after 30m" in planned._repr_html_()
    zero = cli("plan", train, "--max-idle", "0")
    assert zero.returncode == 2 and "write off to turn it off" in zero.stderr, zero.stderr
    init = tmp_path / "init"
    init.mkdir()
    assert cli("init", cwd=init).returncode == 0
    assert "\nmax_idle: 30m" in (init / "cloudtrain.yaml").read_text()


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
