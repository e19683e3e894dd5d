"""The local provider end to end: real torchrun agents, real gloo processes, a job record in SQLite."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cloudtrain import Job, Run, list_runs
from cloudtrain.bundle.staging import stage_bundle
from cloudtrain.home.procs import group_alive, kill_tagged, tag_alive
from cloudtrain.providers.local.provider import LocalProvider
from tests.conftest import REPO, SCRIPTS, cli_env, status_json, wait_for

pytestmark = pytest.mark.slow
ENTRYPOINTS = REPO / "entrypoints"


def copy_script(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / src.name
    target.write_text(src.read_text())
    return target


def node_pgids(cli, handle: str) -> list[int]:
    return [n["pid"] for n in status_json(cli, handle)["nodes"]]


def node_tags(cli, handle: str) -> list[str]:
    return [n["tag"] for n in status_json(cli, handle)["nodes"]]


def test_two_nodes_two_procs_detached_then_managed_from_other_processes(cli, tmp_path: Path) -> None:
    script = copy_script(ENTRYPOINTS / "plain_torchrun.py", tmp_path / "proj")
    submitted = cli("submit", str(script), "--nodes", "2", "--procs-per-node", "2", "--detach")
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    assert handle.startswith("local://plain-torchrun-")

    # every later command is a new process: the job record lives in the database, not in the CLI
    waited = cli("wait", handle, "--timeout", "180")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    status = status_json(cli, handle)
    assert status["state"] == "succeeded"
    assert status["world_size"] == 4
    assert [n["exit_code"] for n in status["nodes"]] == [0, 0]

    logs = cli("logs", handle).stdout
    assert "all_reduce ok: True world_size=4" in logs
    group_ranks = set(re.findall(r"group_rank=(\d)", logs))
    assert group_ranks == {"0", "1"}, "two real torchrun agents took part"
    assert "[node0]" in logs and "[node1]" in logs

    listed = cli("list", "-o", "json")
    assert handle in [j["handle"] for j in json.loads(listed.stdout)]
    assert handle in cli("list").stdout
    # cancelling a finished job changes nothing
    again = cli("cancel", handle, "-o", "json")
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "succeeded"


def test_ddp_reference_trainer_in_the_foreground(cli, tmp_path: Path) -> None:
    result = cli("submit", str(ENTRYPOINTS / "train_ddp.py"), "--nodes", "2", "--procs-per-node", "2",
                 "--", "--epochs", "3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    first = re.search(r"epoch 0 step \d+ loss ([\d.]+)", result.stdout)
    done = re.search(r"done: world_size=4 steps=\d+ final_loss=([\d.]+)", result.stdout)
    assert first and done, result.stdout[-3000:]
    assert float(done.group(1)) < float(first.group(1)) / 2
    assert "succeeded" in result.stderr

    # its outputs: the final model and each node's worker logs, in the job's own folder of the local store
    handle = re.search(r"submitted (local://\S+)", result.stderr).group(1)  # type: ignore[union-attr]
    listed = cli("outputs", handle)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["NAME", "SIZE", "URI"] and "model.pt" in listed.stdout
    fetched = cli("outputs", handle, "--download", str(tmp_path / "out"), "-o", "json")
    assert fetched.returncode == 0, fetched.stderr
    files = {f["name"]: f for f in json.loads(fetched.stdout)["files"]}
    assert files["model.pt"]["bytes"] == (tmp_path / "out" / "model.pt").stat().st_size > 0
    for node in (0, 1):
        logs = sorted(n for n in files if n.startswith(f"logs/node-{node}/") and n.endswith("stdout.log"))
        # one per process of the node, named by attempt and local rank (torchrun's run folder dropped)
        assert logs == [f"logs/node-{node}/attempt_0/local-rank-{r}/stdout.log" for r in (0, 1)], files
    assert any("done: world_size=4" in (tmp_path / "out" / n).read_text() for n in files if "stdout" in n)


def test_a_resumed_reference_trainer_never_logs_a_loss_it_did_not_compute(cli, tmp_path: Path) -> None:
    """29.9: resumed at an epoch's end (the tour's `-- --epochs 5` after a 3-epoch run), its first line read
    'loss 0.000000'; resumed after its last step, 'final_loss=0.000000'."""
    script = copy_script(ENTRYPOINTS / "train_ddp.py", tmp_path / "proj")
    job = [str(script), "--procs-per-node", "1", "--checkpoint-uri", (tmp_path / "ckpt").as_uri(), "--", "--samples",
           "128", "--epochs"]  # 4 steps an epoch
    runs = [cli("submit", *job, epochs) for epochs in ("1", "2", "2")]
    assert all(r.returncode == 0 for r in runs), [r.stdout[-2000:] + r.stderr for r in runs]
    first, more, nothing_left = (r.stdout for r in runs)
    assert re.search(r"epoch 0 step 4 loss (?!0\.000000)[\d.]+", first)
    assert "start_step=4" in more and "epoch 0 step" not in more  # epoch 0 ran before the resume
    assert re.search(r"epoch 1 step 8 loss (?!0\.000000)[\d.]+", more) and "final_loss=0.000000" not in more
    assert "start_step=8" in nothing_left and " loss " not in nothing_left
    assert "final_loss=n/a (every step ran before the resume)" in nothing_left


def test_node_logs_upload_names(tmp_path: Path) -> None:
    """`upload-logs` (run by the bootstrap) names logs by attempt and local rank; torchrun's run folder stays only
    when a node ran torchrun more than once, so no two runs' logs land on one name."""
    from cloudtrain.node import output_upload

    def tree(root: Path, runs: list[str]) -> None:
        for run in runs:
            for rank in (0, 1):
                log = root / run / "attempt_0" / str(rank) / "stdout.log"
                log.parent.mkdir(parents=True)
                log.write_text(f"{run} {rank}")

    def uploaded(runs: list[str]) -> dict[str, str]:
        logs, out = tmp_path / f"logs{len(runs)}", tmp_path / f"out{len(runs)}"
        tree(logs, runs)
        assert output_upload.main(["upload-logs", str(logs), out.as_uri()]) == 0
        return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}

    assert uploaded(["a1b2_x9"]) == {"attempt_0/local-rank-0/stdout.log": "a1b2_x9 0",
                                     "attempt_0/local-rank-1/stdout.log": "a1b2_x9 1"}
    twice = uploaded(["r1_aa", "r2_bb"])
    assert set(twice) == {f"{run}/attempt_0/local-rank-{r}/stdout.log" for run in ("r1_aa", "r2_bb") for r in (0, 1)}
    assert twice["r2_bb/attempt_0/local-rank-1/stdout.log"] == "r2_bb 1"


def test_global_rank_zero_runs_on_node_zero(cli, tmp_path: Path) -> None:
    """As on every cloud (static node ranks), node 0 hosts global rank 0 under local c10d rendezvous too: it is the
    node that publishes a plain script's checkpoints."""
    script = tmp_path / "proj" / "ranks.py"
    script.parent.mkdir()
    script.write_text("import os\nprint(f\"placed node={os.environ['CLOUDTRAIN_NODE_RANK']} "
                      "rank={os.environ['RANK']} of {os.environ['WORLD_SIZE']}\", flush=True)\n")
    result = cli("submit", str(script), "--nodes", "3", "--procs-per-node", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    placed = dict(re.findall(r"placed node=(\d) rank=(\d) of 3", result.stdout))
    assert placed["0"] == "0" and sorted(placed.values()) == ["0", "1", "2"], placed


def test_fsdp_reference_trainer_through_the_sdk(ct_home: Path) -> None:
    job = Job(script="train_fsdp.py", source_dir=str(ENTRYPOINTS), strategy="fsdp", nodes=1, procs_per_node=2,
              args=["--epochs", "2", "--bf16"])
    run = job.submit("local")
    status = run.wait(timeout=240, poll=0.5)
    logs = "\n".join(run.logs())
    assert status.state.value == "succeeded", logs[-3000:]
    assert status.message == "", "a device mesh's process group counts: not a hollow run"
    assert "training: fsdp world_size=2 backend=gloo bf16=True start_step=0" in logs
    assert str(run.handle) in [str(s.handle) for s in list_runs("local")]
    assert Run.attach(str(run.handle)).status().state.value == "succeeded"


def test_failure_in_user_code_fails_the_job(cli, tmp_path: Path) -> None:
    script = copy_script(SCRIPTS / "fails.py", tmp_path / "proj")
    handle = cli("submit", str(script), "--procs-per-node", "2", "--detach").stdout.strip()
    waited = cli("wait", handle, "--timeout", "180")
    assert waited.returncode == 1
    status = status_json(cli, handle)
    assert status["state"] == "failed"
    assert "node 0 failed" in status["message"]
    assert "rank 1: simulated bug" in cli("logs", handle).stdout


def test_cancel_from_another_process_stops_every_process(cli, tmp_path: Path) -> None:
    script = copy_script(SCRIPTS / "sleeper.py", tmp_path / "proj")
    handle = cli("submit", str(script), "--nodes", "2", "--procs-per-node", "2", "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 4, timeout=120, interval=1)
    pgids, tags = node_pgids(cli, handle), node_tags(cli, handle)
    assert all(group_alive(p) for p in pgids) and all(tag_alive(t) for t in tags)

    cancelled = cli("cancel", handle, "-o", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] in ("stopping", "cancelled")
    final = cli("wait", handle, "--timeout", "120")
    assert final.returncode == 1
    assert status_json(cli, handle)["state"] == "cancelled"
    wait_for(lambda: not any(group_alive(p) for p in pgids), timeout=10)
    wait_for(lambda: not any(tag_alive(t) for t in tags), timeout=10)  # the workers too, not just the agents
    assert cli("cancel", handle).returncode == 0  # idempotent


def test_a_job_whose_processes_vanished_shows_failed(cli, ct_home: Path, tmp_path: Path) -> None:
    """Supervisor and nodes killed at once (what a reboot looks like): no node could say how it ended."""
    script = copy_script(SCRIPTS / "sleeper.py", tmp_path / "proj")
    handle = cli("submit", str(script), "--procs-per-node", "2", "--detach").stdout.strip()
    wait_for(lambda: cli("logs", handle).stdout.count("ready rank=") == 2, timeout=120, interval=1)
    record = LocalProvider(ct_home).db.get(handle.split("://")[1])
    assert record and record.supervisor_pid
    pgids, tags = [n["pgid"] for n in record.nodes], [n["tag"] for n in record.nodes]
    assert all(tag_alive(t) for t in tags)
    os.kill(record.supervisor_pid, signal.SIGKILL)
    for tag in tags:
        kill_tagged(tag)
    wait_for(lambda: status_json(cli, handle)["state"] == "failed", timeout=30)
    assert "vanished" in status_json(cli, handle)["message"]
    wait_for(lambda: not any(group_alive(p) for p in pgids), timeout=10)
    wait_for(lambda: not any(tag_alive(t) for t in tags), timeout=10)


def test_staging_is_content_addressed(ct_home: Path, tmp_path: Path) -> None:
    """(A submit retried is one job: the conformance suite's TestLocal.)"""
    script = copy_script(SCRIPTS / "fails.py", tmp_path / "proj")
    job = Job(script=script.name, source_dir=str(script.parent))
    with job.plan("local") as plan:
        assert stage_bundle(plan.package, plan.staging["prefix"]) is True
        assert stage_bundle(plan.package, plan.staging["prefix"]) is False  # unchanged source: nothing uploaded


def test_dry_run_json_has_provider_request_package_nodes(cli, ct_home: Path, tmp_path: Path) -> None:
    script = copy_script(ENTRYPOINTS / "train_ddp.py", tmp_path / "proj")
    result = cli("submit", str(script), "--nodes", "2", "--procs-per-node", "2", "--dry-run", "-o", "json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["provider"] == "local"
    assert plan["request"]["world_size"] == 4
    assert plan["package"]["digest"].startswith("sha256:") and plan["package"]["files"] == [
        {"path": "train_ddp.py", "size": script.stat().st_size}]
    assert [n["rank"] for n in plan["nodes"]] == [0, 1]
    assert "--rdzv-conf" in plan["nodes"][0]["torchrun"] and plan["nodes"][0]["argv"][1].endswith("bootstrap.py")
    assert not (ct_home / "store").exists() and not (ct_home / "jobs.db").exists(), "a dry run stages nothing"


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "SIGTERM")])
def test_ctrl_c_or_sigterm_in_the_foreground_cancels_cleanly(ct_home: Path, tmp_path: Path, sig: int, code: int,
                                                             said: str) -> None:
    """Ctrl-C, and SIGTERM (a CI runner stopping, `timeout`; issue 17.7: it left the job running unseen), cancel."""
    script = copy_script(SCRIPTS / "sleeper.py", tmp_path / "proj")
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "submit", str(script), "--procs-per-node", "2"],
                            cwd=tmp_path, env=cli_env(ct_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:  # logs stream while the job runs
        seen += "ready rank=" in line
        if seen == 2:
            break
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"{said}: cancelling local://sleeper-" in err and "cancelled" in err
    job = LocalProvider(ct_home).list()[0]
    assert job.state.value == "cancelled"
    wait_for(lambda: not any(group_alive(n["pid"]) or tag_alive(n["tag"]) for n in job.nodes), timeout=10)


def test_plan_text_shows_what_the_nodes_will_run(cli, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    assert cli("init", cwd=proj).returncode == 0  # the template asks for A100:8 with procs_per_node: auto
    result = cli("plan", "--nodes", "2", cwd=proj, env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "layout       2 node(s) x 1 process(es) = world size 2, strategy ddp" in result.stdout
    assert "--nproc-per-node 1" in result.stdout


def _tiny_wheel(folder: Path) -> str:
    """A real (hand-built) wheel, so the test needs no index and no build backend."""
    name = "tinydep-0.1-py3-none-any.whl"
    files = {
        "tinydep.py": "VALUE = 42\n",
        "tinydep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinydep\nVersion: 0.1\n",
        "tinydep-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                       "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(folder / name, "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)
        record = "".join(f"{p},,\n" for p in files) + "tinydep-0.1.dist-info/RECORD,,\n"
        whl.writestr("tinydep-0.1.dist-info/RECORD", record)
    return name


def test_requirements_install_into_a_job_private_folder(cli, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "requirements.txt").write_text(f"./{_tiny_wheel(proj)}\n")
    (proj / "uses_dep.py").write_text("import tinydep as t\nprint('dep value', t.VALUE, t.__file__)\n")
    (proj / "cloudtrain.yaml").write_text("script: uses_dep.py\nrequirements: requirements.txt\n")
    result = cli("submit", "-f", "cloudtrain.yaml", cwd=proj)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "dep value 42" in result.stdout
    assert "/node-0/site-packages/tinydep.py" in result.stdout  # not the user's environment


def test_preempted_before_training_starts_is_restarted_not_failed(cli, tmp_path: Path) -> None:
    script = copy_script(ENTRYPOINTS / "train_ddp.py", tmp_path / "proj")
    handle = cli("submit", str(script), "--procs-per-node", "2", "--max-restarts", "1", "--detach",
                 "--", "--epochs", "1").stdout.strip()
    wait_for(lambda: status_json(cli, handle)["state"] == "running", timeout=30, interval=0.1)
    assert cli("preempt", handle).returncode == 0  # lands while nodes unpack, restore or start torchrun
    assert cli("wait", handle, "--timeout", "180").returncode == 0, cli("logs", handle).stdout[-3000:]
    status = status_json(cli, handle)
    assert (status["state"], status["restarts"]) == ("succeeded", 1)


@pytest.mark.parametrize("emulate", [None, "sagemaker"])
def test_a_rendezvous_port_taken_before_the_nodes_bind_it_is_chosen_again(
        ct_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulate: str | None) -> None:
    """Seen in CI: the port submit chooses is free then, yet on a busy machine any process may take it before node
    0's torchrun binds it, and the job failed as 'node 0 failed with exit code 1 (see its log)'. The supervisor
    starts the nodes again on a new port (no restart of the job), and the node's log says why. Under SageMaker's
    contract too (static rendezvous, two nodes, the port in CLOUDTRAIN_MASTER_OVERRIDE)."""
    import socket

    from cloudtrain.providers.local import provider as local_provider

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()  # held for the whole test: the retry must choose another
    taken = held.getsockname()[1]
    monkeypatch.setattr(local_provider, "free_port", lambda: taken)  # submit's choice; the supervisor's is real
    script = copy_script(ENTRYPOINTS / "plain_torchrun.py", tmp_path / "proj")
    job = Job(script=script.name, source_dir=str(script.parent), nodes=2 if emulate else 1,
              procs_per_node=1 if emulate else 2, providers={"local": {"emulate": emulate}} if emulate else {})
    run = job.submit("local")
    try:
        status = run.wait(timeout=240, poll=0.5)
        logs = "\n".join(run.logs())
        assert status.state.value == "succeeded", (status.message, logs[-3000:])
        assert f"port {taken} on this node is held by another process (EADDRINUSE" in logs
        assert f"the rendezvous port {taken} was taken by another process before torchrun bound it: starting " \
               "the nodes again on port" in logs
        assert "all_reduce ok: True world_size=2" in logs and status.restarts == 0
    finally:
        held.close()


def test_a_local_jobs_move_to_running_is_dated_at_the_supervisors_start(ct_home: Path, tmp_path: Path) -> None:
    """Issue 51: a status call that looks late dates the move to running when the supervisor started the nodes (the
    job's started_at, its ``state_since``), not when it looked."""
    import time

    from cloudtrain.home import timeline
    from cloudtrain.sdk import plan_job

    script = copy_script(SCRIPTS / "sleeper.py", tmp_path / "proj")
    provider = LocalProvider()
    with plan_job(Job(script=script.name, source_dir=str(script.parent)).spec, provider, progress=False) as plan:
        handle = provider.submit(plan)
    try:
        wait_for(lambda: getattr(provider.db.get(handle.job_id), "started_at", None) is not None, timeout=60)
        time.sleep(1.5)  # the poll comes late
        before = time.time()
        status = provider.describe(handle)
        running = [e for e in timeline.own_events(str(handle))[0] if e["e"] == "state"][-1]
        assert status.state.value == "running" and status.state_since == status.started_at
        assert running["t"] == round(status.started_at, 3) and running["seen_at"] >= before >= running["t"] + 1
    finally:
        provider.cancel(handle)
