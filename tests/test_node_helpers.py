"""The pieces nodes and status are made of, one by one: durations as people write them, rank reports (in real
processes with real torch.distributed), diagnosis from worker logs, the watchdog's clock, node outcomes, and an
older job database opened by this version."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.node import diagnosis, idle_watchdog, rank_report
from cloudtrain.node.durations import format_duration
from cloudtrain.providers.local import outcome
from cloudtrain.providers.local.jobdb import JobDB, JobRecord
from cloudtrain.spec.model import parse_duration
from tests.conftest import REPO


@pytest.mark.parametrize(("seconds", "text"), [(60, "1m"), (86400, "24h"), (5400, "1h30m"), (90, "1m30s"),
                                               (3600, "1h"), (1, "1s"), (172800, "2d"), (28 * 86400, "28d"),
                                               (2 * 86400 + 7200, "2d2h"), (0, "0s"), (0.4, "0s")])
def test_durations_print_as_people_write_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    if seconds >= 1:
        assert parse_duration(text) == seconds  # what is printed reads back as the same duration


def _worker(tmp_path: Path, code: str, world_size: str = "4") -> dict | None:
    """Run ``code`` as a torchrun worker of a cloudtrain node would run (rank report installed as sitecustomize
    does it); return the report it wrote."""
    reports = tmp_path / "ranks"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": world_size,
           "TORCHELASTIC_RUN_ID": "t", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0",
           rank_report.ENV: str(reports)}
    prelude = "import cloudtrain.node.rank_report as r\nr.install()\n"
    subprocess.run([sys.executable, "-c", prelude + code], env=env, check=True, timeout=120)
    path = reports / "rank-0.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.slow
def test_rank_reports_from_real_processes(tmp_path: Path) -> None:
    alone = _worker(tmp_path / "a", "import torch\nprint(torch.ones(1))\n")
    assert alone and alone["joined"] == 0 and alone["world_size"] == 4
    # a group created through a name imported before the hook could see it, then destroyed before exit
    joined = _worker(tmp_path / "b", "from torch.distributed.distributed_c10d import init_process_group, "
                                     "destroy_process_group\nimport torch, torch.distributed as dist\n"
                                     "init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
                                     "dist.all_reduce(torch.ones(1))\ndist.barrier()\n"
                                     "destroy_process_group()\n", world_size="1")
    assert joined and (joined["joined"], joined["backend"], joined["collectives"]) == (1, "gloo", 2)
    one = _worker(tmp_path / "c", "import torch.distributed as dist\n"
                                  "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n")
    assert one and (one["joined"], one["collectives"]) == (1, 0)  # counted at exit, the group still up
    summary = rank_report.summarize(tmp_path / "c" / "ranks")
    assert summary and summary["group_of_one"] == 1  # a group of 1 in a world of 4: trained alone
    # the worker's own child processes inherit its environment, but never report as the rank
    child = _worker(tmp_path / "d", "import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
                                    "'import cloudtrain.node.rank_report as r; r.install(); print(r._state)'], "
                                    "check=True)\n"
                                    "import os\nos._exit(0)\n")
    assert child is None, "neither the child (no report folder left to it) nor the parent (os._exit) reported"


def test_sentences_for_processes_that_trained_alone() -> None:
    def text(**counts: int) -> str | None:
        return rank_report.alone_text({"world_size": 4, **counts})

    assert text(ran=4, no_group=4) == "4 processes ran, none joined a process group: each trained alone"
    assert text(ran=2, group_of_one=2) == ("2 processes ran, none took part in the job's process group (world size "
                                           "4): each trained alone")
    assert text(ran=2, silent=2).startswith("2 processes ran and joined a process group of 4, but none "
                                            "communicated over it")
    assert text(ran=4, no_group=1) == "4 processes ran, 1 of them outside the job's process group (world size 4)"
    assert rank_report.alone_text({"ran": 1, "no_group": 1, "world_size": 1}) is None  # a world of one: by design
    assert text(ran=4) is None


def _logs(run: Path, rank: int, stdout: str = "", stderr: str = "") -> None:
    folder = run / "attempt_0" / str(rank)
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text(stdout)
    (folder / "stderr.log").write_text(stderr)


def test_diagnosis_reads_the_worker_logs(tmp_path: Path) -> None:
    run = tmp_path / "worker-logs" / "job_abc"
    _logs(run, 0, stderr="Traceback (most recent call last):\n  File \"t.py\", line 4\n"
                         "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'\n")
    _logs(run, 1, stderr="RuntimeError: Connection closed by peer\n")
    assert diagnosis.newest_run(tmp_path / "worker-logs") == run
    on_cpu = diagnosis.explain_failure(run, gpus=0)
    assert on_cpu and on_cpu.startswith("local rank 0 needs a GPU and this machine has none (AttributeError:")
    assert diagnosis.GPU_FIX in on_cpu
    on_gpu = diagnosis.explain_failure(run, gpus=8)  # with GPUs the same error is just an error
    assert on_gpu == "local rank 0: AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
    idle = tmp_path / "idle" / "job_def"
    _logs(idle, 0, stdout="starting\n")
    _logs(idle, 1, stdout="Unable to locate sufficient 2 gpus\n")
    hint = diagnosis.explain_idle_gpu_script(idle, gpus=0)
    assert hint and hint.startswith("local rank 1 printed 'Unable to locate sufficient 2 gpus'")
    assert diagnosis.explain_idle_gpu_script(idle, gpus=2) is None
    assert diagnosis.explain_failure(None, gpus=0) is None


def test_fsdp_on_a_torch_that_runs_it_on_cuda_only_names_the_torch_not_the_script(tmp_path: Path) -> None:
    """torch 2.4/2.5 (the reference FSDP trainer under `nox -s compat`): the script already picks its device from
    the environment, so the fix is a GPU or a newer torch, not init_distributed()."""
    run = tmp_path / "worker-logs" / "job_abc"
    _logs(run, 0, stderr="Traceback (most recent call last):\n  File \"train_fsdp.py\", line 60\n"
                         "RuntimeError: FSDP requires CUDA for streams\n")
    said = diagnosis.explain_failure(run, gpus=0)
    assert said == ("local rank 0 needs a GPU and this machine has none (RuntimeError: FSDP requires CUDA for "
                    f"streams): {diagnosis.FSDP_FIX}") and diagnosis.GPU_FIX not in said
    older = tmp_path / "worker-logs-2.4" / "job_abc"  # torch 2.4 fails in torch.cuda.Stream, called by its FSDP
    fsdp = "/venv/lib/python3.11/site-packages/torch/distributed/_composable/fsdp"
    _logs(older, 0, stderr="[rank0]: Traceback (most recent call last):\n"
                           f'[rank0]:   File "{fsdp}/_fsdp_param_group.py", line 49, in init\n'
                           "[rank0]:     self.all_gather_copy_in_stream = torch.cuda.Stream(priority=high_priority)\n"
                           '[rank0]:   File "/venv/lib/python3.11/site-packages/torch/cuda/streams.py", line 35\n'
                           "[rank0]: RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime "
                           "version\n")
    said = diagnosis.explain_failure(older, gpus=0)
    assert said and said.endswith(diagnosis.FSDP_FIX), said
    elsewhere = tmp_path / "worker-logs-cuda" / "job_abc"  # a CUDA call of the script's own: the usual fix
    _logs(elsewhere, 0, stderr="[rank0]: Traceback (most recent call last):\n"
                               '[rank0]:   File "train.py", line 4, in <module>\n'
                               "[rank0]: RuntimeError: CUDA error: CUDA driver version is insufficient\n")
    assert (diagnosis.explain_failure(elsewhere, gpus=0) or "").endswith(diagnosis.GPU_FIX)


STORE_TAKEN = """Traceback (most recent call last):
  File "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 156, in _create_tcp_store
    store = TCPStore(
torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 39615, \
useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 180, in _create_tcp_store
    raise RendezvousConnectionError(
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. \
See inner exception for details.
"""


def test_a_launcher_failure_with_no_worker_to_blame_is_named(tmp_path: Path) -> None:
    """A node whose torchrun failed before starting any worker said only 'torchrun exited 1; the node's log says
    why'. Its own exception is named from torchrun.log; a rendezvous port another process holds says which port
    and is marked for the local supervisor to choose another; a failed worker is left to the worker's logs."""
    logs = tmp_path / "work" / "worker-logs"
    logs.mkdir(parents=True)
    (logs / diagnosis.LAUNCHER_LOG).write_text(STORE_TAKEN)
    found = diagnosis.findings(tmp_path / "work", "failed", 0, {})
    assert found["reason"].startswith("torchrun could not start the rendezvous: port 39615 on this node is held by "
                                      "another process (EADDRINUSE")
    assert "RendezvousConnectionError" in found["reason"] and found["cause"] == diagnosis.PORT_IN_USE
    (logs / diagnosis.LAUNCHER_LOG).write_text(
        "Traceback (most recent call last):\n  File \"run.py\", line 9\ntorch.distributed.elastic.rendezvous.api."
        "RendezvousTimeoutError: Timed out after 900 seconds waiting for clients. 1/2 clients joined.\n")
    found = diagnosis.findings(tmp_path / "work", "failed", 0, {})
    assert found["reason"] == ("torchrun failed before its workers did: torch.distributed.elastic.rendezvous.api."
                               "RendezvousTimeoutError: Timed out after 900 seconds waiting for clients. 1/2 clients "
                               "joined.") and "cause" not in found
    (logs / diagnosis.LAUNCHER_LOG).write_text(
        "Traceback (most recent call last):\n  File \"run.py\", line 9\ntorch.distributed.elastic.multiprocessing."
        "errors.ChildFailedError: \n====\ntrain.py FAILED\n")
    assert diagnosis.findings(tmp_path / "work", "failed", 0, {}) == {}  # a worker failed: its own logs say more
    (logs / diagnosis.LAUNCHER_LOG).write_text(  # an earlier run's stop, in a folder a restart reuses
        "Traceback (most recent call last):\n  File \"run.py\", line 9\ntorch.distributed.elastic.multiprocessing."
        "api.SignalException: Process 4242 got signal: 15\n")
    assert diagnosis.findings(tmp_path / "work", "failed", 0, {}) == {}


def test_diagnosis_names_the_exception_a_traceback_ended_in(tmp_path: Path) -> None:
    """29.1: torch's [rankN]: prefix, an exception without a message, lines printed after the traceback, chains."""
    bare = ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "t.py", line 3, in <module>',
            "[rank0]:     assert loss > 0", "[rank0]: AssertionError", "",
            "[W1125 ProcessGroup.cpp:123] Warning: WARNING: destroy_process_group() was not called before exit"]
    assert diagnosis.last_exception([diagnosis._RANK_PREFIX.sub("", line) for line in bare]) == "AssertionError"
    handled = ["Traceback (most recent call last):", '  File "t.py", line 2', "KeyError: 'lr'", "",
               "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):", '  File "t.py", line 4', "ValueError: no learning rate"]
    assert diagnosis.last_exception(handled) == "ValueError: no learning rate (raised while handling KeyError: 'lr')"
    # a rank whose peer went away is named only when no rank raised anything else, whichever wrote last
    run = tmp_path / "job_abc"
    _logs(run, 0, stderr="Traceback (most recent call last):\nRuntimeError: Connection closed by peer [::1]:5\n")
    _logs(run, 1, stderr="Traceback (most recent call last):\nOSError: disk full\n")
    os.utime(run / "attempt_0" / "1" / "stderr.log", (time.time() + 5, time.time() + 5))
    assert diagnosis.first_failure(run) == ("1", "OSError: disk full")
    # an elastic error file (a main wrapped in @record) wins over what stderr ended with
    (run / "attempt_0" / "1" / "error.json").write_text(json.dumps({"message": {
        "message": "ValueError: bad", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File "
                                                                   "\"t.py\"\nValueError: bad\n", "timestamp": "1"}}}))
    assert diagnosis.first_failure(run) == ("1", "ValueError: bad")


def test_the_watchdog_clock_reads_logs_and_checkpoints(tmp_path: Path) -> None:
    logs, ckpt = tmp_path / "worker-logs", tmp_path / "checkpoints"
    assert idle_watchdog.newest_change([logs, ckpt]) == 0.0
    (ckpt / "step-000000010").mkdir(parents=True)
    shard = ckpt / "step-000000010" / "shard.pt"
    shard.write_bytes(b"x")
    os.utime(shard, (time.time() + 100, time.time() + 100))
    assert idle_watchdog.newest_change([logs, ckpt]) == pytest.approx(shard.stat().st_mtime)
    assert idle_watchdog.idle_limit({idle_watchdog.ENV: "600"}) == 600 and idle_watchdog.idle_limit({}) is None
    assert idle_watchdog.idle_limit({idle_watchdog.ENV: "soon"}) is None
    node = _node_whose_agent_starts_a_worker_after(0)
    fired: list[str] = []
    done = idle_watchdog.start([logs], 0.05, fired.append, root=node.pid)
    deadline = time.monotonic() + 30
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    done.set()
    _end(node)
    assert fired == [idle_watchdog.idle_reason(0.05)]


def _node_whose_agent_starts_a_worker_after(seconds: float) -> subprocess.Popen[bytes]:
    """A stand-in node: its child (torchrun's agent) waits ``seconds`` without CPU, as an agent waits in its
    rendezvous for the other nodes, then starts a worker that sleeps (idle)."""
    agent = f"import subprocess, time; time.sleep({seconds}); subprocess.run(['sleep', '60'])"
    return subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{agent}"; :'], start_new_session=True)


def _end(node: subprocess.Popen[bytes]) -> None:
    os.killpg(node.pid, signal.SIGKILL)
    node.wait()


def test_the_watchdog_clock_starts_when_a_worker_does(tmp_path: Path) -> None:
    """Under load, node 1 of a two-node job took more than max_idle to start: node 0's torchrun, waiting in its
    rendezvous (no worker yet, no CPU), was stopped as hung. Before the first worker, torchrun's own rendezvous
    timeout bounds the wait; idleness is the workers'."""
    node = _node_whose_agent_starts_a_worker_after(4)
    fired: list[float] = []
    started = time.monotonic()
    done = idle_watchdog.start([tmp_path], 1.0, lambda _: fired.append(time.monotonic() - started), root=node.pid)
    deadline = started + 60
    while not fired and time.monotonic() < deadline:
        time.sleep(0.1)
    done.set()
    _end(node)
    assert fired and fired[0] >= 4.0, fired  # the idle second counts from the worker's start, not the agent's


def test_node_outcomes_say_what_stopped_them(tmp_path: Path) -> None:
    status = tmp_path / "node-0.status.json"
    status.write_text(json.dumps({"outcome": "preempted", "returncode": 1}))
    for stop, expected in ((outcome.PREEMPT, "preempted"), (outcome.CANCEL, "cancelled"),
                           (outcome.MAX_RUNTIME, "stopped"), (outcome.PEER_FAILED, "stopped")):
        node = {"rank": 0, "exit_code": 143, "status_file": str(status)}
        outcome.settle_node(node, stop)
        assert node["outcome"] == expected
    died = {"rank": 1, "exit_code": -9, "status_file": str(tmp_path / "none.json")}
    outcome.settle_node(died, None)
    assert died["outcome"] == "failed"
    state, message = outcome.final_state([{"rank": 0, "outcome": "stopped"}], cancelled=False,
                                         stop=outcome.MAX_RUNTIME, attempt=0, max_runtime=60, ran_for=61.2)
    assert (state, message) == ("failed", "max_runtime 1m exceeded: stopped after 1m1s")


def test_an_older_job_database_opens(tmp_path: Path) -> None:
    """A database written by the previous version (no lost_at column) is migrated on open; its jobs read."""
    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, message TEXT "
                     "NOT NULL DEFAULT '', created_at REAL NOT NULL, started_at REAL, ended_at REAL, job_dir TEXT "
                     "NOT NULL, grace_period REAL NOT NULL DEFAULT 30, cancel_requested INTEGER NOT NULL DEFAULT 0, "
                     "attempt INTEGER NOT NULL DEFAULT 0, supervisor_pid INTEGER, supervisor_start INTEGER, nodes "
                     "TEXT NOT NULL DEFAULT '[]', plan TEXT NOT NULL DEFAULT '{}')")
        conn.execute("INSERT INTO jobs (id, name, state, created_at, job_dir) VALUES ('old', 'old', 'succeeded', 1, "
                     "'/x')")
    db = JobDB(path)
    old = db.get("old")
    assert old and old.state == "succeeded" and old.lost_at is None
    assert db.insert(JobRecord(id="new", name="new", state="pending", job_dir="/y"))
    assert db.update("new", lost_at=5.0) and (db.get("new") or old).lost_at == 5.0
