"""Local jobs end, and say how, whatever happens to the processes around them: a killed supervisor, a CLI killed
while submitting, a job that runs too long, a cancel, a rehearsed preemption. (SIGTERM to a foreground submit:
tests/test_local_provider.py, beside Ctrl-C.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.home.procs import is_alive, tag_alive
from cloudtrain.providers.local.jobdb import JobDB, JobRecord
from cloudtrain.providers.local.provider import START_TIMEOUT, LocalProvider
from tests.conftest import SCRIPTS, cli_env, status_json, wait_for

pytestmark = pytest.mark.slow


def project(tmp_path: Path, *scripts: str) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    for name in scripts:
        (proj / name).write_text((SCRIPTS / name).read_text())
    return proj


def record_of(home: Path, handle: str) -> JobRecord:
    record = LocalProvider(home).db.get(handle.split("://", 1)[1])
    assert record is not None
    return record


def test_nodes_stop_on_their_own_when_the_supervisor_is_killed(cli, ct_home: Path, tmp_path: Path) -> None:
    """15.10: nobody calls status; the nodes (bootstraps, torchrun agents, workers) see the supervisor go and stop."""
    proj = project(tmp_path, "sleeper.py")
    handle = cli("submit", str(proj / "sleeper.py"), "--nodes", "2", "--procs-per-node", "2", "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 4, timeout=120, interval=1)
    record = record_of(ct_home, handle)
    tags = [n["tag"] for n in record.nodes]
    assert record.supervisor_pid and all(tag_alive(t) for t in tags)

    os.kill(record.supervisor_pid, signal.SIGKILL)  # an OOM kill, or `kill -9`
    wait_for(lambda: not any(tag_alive(t) for t in tags), timeout=20)  # promptly, and without any status call
    assert "its supervisor is gone" in (ct_home / "jobs" / record.id / "node-0.log").read_text()

    status = status_json(cli, handle)
    assert status["state"] == "failed"
    assert "supervisor is gone" in status["message"], status["message"]
    assert cli("wait", handle, timeout=60).returncode == 1  # no timeout needed: it has ended


def test_a_node_that_ignores_sigterm_is_killed_after_its_grace_period(cli, ct_home: Path, tmp_path: Path) -> None:
    """Without its supervisor, the node enforces the grace period itself: everything below its bootstrap (torchrun
    and the workers in their own sessions) is killed, before torchrun's own 30 s shutdown timeout would."""
    proj = project(tmp_path, "ignores_sigterm.py")
    handle = cli("submit", str(proj / "ignores_sigterm.py"), "--procs-per-node", "2", "--set",
                 "providers.local.grace_period=3s", "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 2, timeout=120, interval=1)
    record = record_of(ct_home, handle)
    assert record.supervisor_pid
    os.kill(record.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not tag_alive(record.nodes[0]["tag"]), timeout=20)
    log = (ct_home / "jobs" / record.id / "node-0.log").read_text()
    assert "still running 3s after stopping: killed" in log
    status = status_json(cli, handle)
    assert status["state"] == "failed" and "supervisor is gone" in status["message"]


def test_a_job_that_finished_while_its_supervisor_was_down_reads_succeeded(cli, ct_home: Path,
                                                                           tmp_path: Path) -> None:
    """15.11: the nodes wrote `succeeded`; the supervisor died before recording it. Status reads the nodes."""
    proj = project(tmp_path, "waits_for_go.py")
    go = tmp_path / "go"
    handle = cli("submit", str(proj / "waits_for_go.py"), "--nodes", "2", "--procs-per-node", "1", "--detach",
                 "--", str(go)).stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 2, timeout=120, interval=1)
    record = record_of(ct_home, handle)
    assert record.supervisor_pid
    os.kill(record.supervisor_pid, signal.SIGSTOP)  # alive (its pipe open) but recording nothing
    try:
        go.touch()
        status_files = [Path(n["status_file"]) for n in record.nodes]
        wait_for(lambda: all(f.exists() for f in status_files), timeout=120)
        assert all(json.loads(f.read_text())["outcome"] == "succeeded" for f in status_files)
    finally:
        os.kill(record.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not is_alive(record.supervisor_pid, record.supervisor_start), timeout=10)
    status = status_json(cli, handle)
    assert status["state"] == "succeeded", status
    assert [n["outcome"] for n in status["nodes"]] == ["succeeded", "succeeded"]
    assert cli("wait", handle, timeout=60).returncode == 0


def _orphan_record(home: Path, job_id: str, created_at: float, supervisor_pid: int | None = None) -> str:
    """A job record as a CLI killed between recording the job and starting its supervisor leaves it."""
    job_dir = home / "jobs" / job_id
    job_dir.mkdir(parents=True)
    plan = {"nodes": [{"rank": 0, "argv": [], "env": {}}], "request": {"max_restarts": 0}, "spec": {}}
    JobDB(home / "jobs.db").insert(JobRecord(id=job_id, name="orphan", state="pending", job_dir=str(job_dir),
                                             created_at=created_at, plan=plan, supervisor_pid=supervisor_pid))
    return f"local://{job_id}"


def test_a_job_whose_supervisor_never_started_ends(cli, ct_home: Path) -> None:
    """15.11: pending forever before; now failed once the start window has passed, and `wait` returns."""
    handle = _orphan_record(ct_home, "orphan-1", time.time() - START_TIMEOUT - 1)
    waited = cli("wait", handle, timeout=60)  # no --timeout: it must not hang
    assert waited.returncode == 1
    status = status_json(cli, handle)
    assert status["state"] == "failed" and "never started" in status["message"]


def test_cancelling_a_job_whose_supervisor_never_started(cli, ct_home: Path) -> None:
    """15.11: `cancel` left such a job `stopping` forever; now it is cancelled at once."""
    handle = _orphan_record(ct_home, "orphan-2", time.time())
    cancelled = cli("cancel", handle, "-o", "json")
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["state"] == "cancelled"
    assert cli("wait", handle, timeout=60).returncode == 1


def test_a_supervisor_that_died_before_starting_nodes(cli, ct_home: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "print('Traceback: simulated crash')"])
    dead.wait()
    job_dir = ct_home / "jobs" / "orphan-3"
    handle = _orphan_record(ct_home, "orphan-3", time.time(), supervisor_pid=dead.pid)
    (job_dir / "supervisor.log").write_text("starting\nRuntimeError: simulated crash\n")
    status = status_json(cli, handle)
    assert status["state"] == "failed"
    assert "exited before starting the nodes: RuntimeError: simulated crash" in status["message"]


def test_a_supervisor_without_the_node_environment_fails_the_job(ct_home: Path, tmp_path: Path) -> None:
    """The submitter died before handing over the (unredacted) node environment: the job fails, and never runs
    with the masked values the record holds."""
    handle = _orphan_record(ct_home, "orphan-4", time.time())
    ran = subprocess.run([sys.executable, "-m", "cloudtrain.providers.local.supervisor", "orphan-4"],
                         env=cli_env(ct_home), stdin=subprocess.DEVNULL, timeout=60)
    assert ran.returncode == 1
    record = JobDB(ct_home / "jobs.db").get("orphan-4")
    assert record and record.state == "failed" and "environment" in record.message, handle
    assert record.nodes == []


def test_max_runtime_stops_a_local_job_and_says_why(cli, tmp_path: Path) -> None:
    """17.6: a job past max_runtime was still running at 400 s; now it stops like a cloud job, and says why."""
    proj = project(tmp_path, "sleeper.py")
    handle = cli("submit", str(proj / "sleeper.py"), "--procs-per-node", "2", "--max-runtime", "8s",
                 "--detach").stdout.strip()
    waited = cli("wait", handle, "--timeout", "180")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    status = status_json(cli, handle)
    assert status["state"] == "failed"
    assert status["message"].startswith("max_runtime 8s exceeded: stopped after "), status["message"]
    assert [n["outcome"] for n in status["nodes"]] == ["stopped"]


def test_plan_prints_durations_as_people_write_them(cli, tmp_path: Path) -> None:
    proj = project(tmp_path, "sleeper.py")
    minute = cli("plan", str(proj / "sleeper.py"), "--max-runtime", "60", "--max-idle", "10m")
    assert minute.returncode == 0, minute.stderr
    assert "max runtime  1m, stopped as hung after 10m without output, checkpoint or CPU use" in minute.stdout
    day = cli("plan", str(proj / "sleeper.py"), "-p", "aws", "--gpus", "A10G:1", "--set",
              "providers.aws.region=us-east-1", "--set", "providers.aws.role=arn:aws:iam::123456789012:role/x")
    assert day.returncode == 0, day.stderr
    assert "max runtime  24h, stopped as hung after 30m " in day.stdout  # max_idle's default
    assert " in 24h" in day.stdout and "0.0166667h" not in day.stdout


def test_preempt_says_what_it_did(cli, tmp_path: Path) -> None:
    """17.7: it printed only the status; now what was sent, to how many nodes, and what follows."""
    proj = project(tmp_path, "sleeper.py")
    handle = cli("submit", str(proj / "sleeper.py"), "--nodes", "2", "--procs-per-node", "1",
                 "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 2, timeout=120, interval=1)
    preempted = cli("preempt", handle)
    assert preempted.returncode == 0, preempted.stderr
    lines = preempted.stdout.splitlines()
    assert lines[0] == f"sent SIGTERM to 2 node(s) of {handle}, as a spot interruption would"
    assert lines[1].startswith("max_restarts is 0: the job will end 'preempted'") and "--max-restarts 1" in lines[1]
    assert cli("wait", handle, "--timeout", "120").returncode == 1
    status = status_json(cli, handle)
    assert status["state"] == "preempted" and {n["outcome"] for n in status["nodes"]} == {"preempted"}
    # 29.2: torchrun's SignalException traceback was more than half the log; cloudtrain sent the signal, so the node
    # log says "preempted" without it, and torchrun's own stderr keeps it beside the workers' logs
    for node in status["nodes"]:
        log = Path(node["log"]).read_text()
        assert "Traceback" not in log and "SignalException" not in log, log
        assert f"[cloudtrain] node {node['rank']} preempted (torchrun exit" in log.splitlines()[-1]
        kept = Path(status["output_uri"].removeprefix("file://")) / "logs" / f"node-{node['rank']}" / "torchrun.log"
        assert "SignalException: Process" in kept.read_text()


def _torchrun_of(bootstrap: int) -> int:
    """The pid of the torchrun agent a node's bootstrap started."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == bootstrap and \
                    b"torch.distributed.run" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no torchrun below pid {bootstrap}")


KEEP_ALIVE_S = 5  # torch's c10d rendezvous sends a keep-alive through the store this often (keep_alive_interval)
TEARDOWN_NOISE = ("Traceback", "SignalException", "[c10d]", "frame #", "<omitting python frames>",
                  "failed to send a keep-alive heartbeat", "terminate called", "Fatal Python error")


def test_a_busy_node_preempted_after_its_peer_left_says_nothing_of_its_teardown(cli, tmp_path: Path) -> None:
    """Issue 50: on a busy machine node 1's torchrun runs late, after node 0's agent (which hosts the rendezvous
    store) has exited: its keep-alive thread's c10d warning with its C++ stack, the rendezvous' line about it and
    its SignalException traceback, in whatever order its threads wrote them, reached node 1's log. Made certain
    here: node 1's torchrun is frozen (SIGSTOP) across the preemption until node 0 has ended."""
    proj = project(tmp_path, "sleeper.py")
    handle = cli("submit", str(proj / "sleeper.py"), "--nodes", "2", "--procs-per-node", "1",
                 "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 2, timeout=120, interval=1)
    nodes = {n["rank"]: n for n in status_json(cli, handle)["nodes"]}
    agent = _torchrun_of(nodes[1]["pid"])
    os.kill(agent, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        assert cli("preempt", handle).returncode == 0
        wait_for(lambda: "[cloudtrain] node 0 preempted" in Path(nodes[0]["log"]).read_text(), timeout=120)
        time.sleep(max(0.0, KEEP_ALIVE_S + 1 - (time.monotonic() - frozen)))  # its keep-alive is due when it runs
    finally:
        os.kill(agent, signal.SIGCONT)
    assert cli("wait", handle, "--timeout", "120").returncode == 1
    status = status_json(cli, handle)
    assert [n["outcome"] for n in status["nodes"]] == ["preempted", "preempted"]
    for node in status["nodes"]:
        log = Path(node["log"]).read_text()
        assert not [noise for noise in TEARDOWN_NOISE if noise in log], log
        assert f"[cloudtrain] node {node['rank']} preempted (torchrun exit" in log.splitlines()[-1]
    kept = Path(status["output_uri"].removeprefix("file://")) / "logs" / "node-1" / "torchrun.log"
    assert "SignalException: Process" in kept.read_text()  # all of it kept beside the workers' logs


def test_cancelled_nodes_read_cancelled_not_preempted(cli, tmp_path: Path) -> None:
    """17.7: a cancelled job listed its nodes as `exit 143 (preempted)`."""
    proj = project(tmp_path, "sleeper.py")
    handle = cli("submit", str(proj / "sleeper.py"), "--nodes", "2", "--procs-per-node", "1",
                 "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 2, timeout=120, interval=1)
    assert cli("cancel", handle).returncode == 0
    assert cli("wait", handle, "--timeout", "120").returncode == 1
    status = status_json(cli, handle)
    assert status["state"] == "cancelled"
    assert [n["outcome"] for n in status["nodes"]] == ["cancelled", "cancelled"]
    assert "(preempted)" not in cli("status", handle).stdout
    for node in status["nodes"]:  # 29.2: the node's own last line said "preempted" too
        last = Path(node["log"]).read_text().splitlines()[-1]
        assert f"[cloudtrain] node {node['rank']} stopped: cancelled by user (torchrun exit" in last, last


def test_a_node_stopped_because_its_peer_failed_never_reads_preempted(cli, tmp_path: Path) -> None:
    """29.2: node 1's worker raised; the supervisor stopped node 0, whose log ended 'node 0 preempted'."""
    proj = project(tmp_path, "raises_after_init.py")
    handle = cli("submit", str(proj / "raises_after_init.py"), "--nodes", "2", "--procs-per-node", "1", "--detach",
                 "--", "sleep").stdout.strip()
    assert cli("wait", handle, "--timeout", "180").returncode == 1
    status = status_json(cli, handle)
    assert status["message"].startswith("node 1 failed with exit code 1: local rank 0: RuntimeError: dataset not "
                                        "found"), status["message"]
    assert [n["outcome"] for n in status["nodes"]] == ["stopped", "failed"]
    assert status["nodes"][0]["reason"] == "stopped: node 1 failed"
    log = Path(status["nodes"][0]["log"]).read_text()
    assert "preempted" not in log and "SignalException" not in log, log
    assert "[cloudtrain] node 0 stopped: node 1 failed (torchrun exit" in log.splitlines()[-1]
    assert "    stopped: node 1 failed" in cli("status", handle).stdout
