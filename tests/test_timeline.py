"""Issue 41.1, 41.2, 41.4: a job's timeline (client events in the home, node events in its logs), its progress and
goodput in `status` (text and -o json), and `status -o openmetrics` read back with prometheus_client's own parser.
Real local jobs (the reference DDP trainer, a rehearsed preemption) through the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.conftest import status_json, wait_for

pytestmark = pytest.mark.slow

Cli = Callable[..., CompletedProcess[str]]


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def preempted_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, str, Path]]:
    """One job for the module: trains, is preempted (`cloudtrain preempt`) after its first checkpoints, restarts
    from its newest checkpoint and succeeds."""
    import subprocess
    import sys

    from cloudtrain.testing.fixtures import ddp_project, stop_every_job
    from tests.conftest import cli_env

    tmp = tmp_path_factory.mktemp("timeline")
    home = tmp / "ct-home"

    def cli(*args: str) -> CompletedProcess[str]:
        env = {**cli_env(home), "CLOUDTRAIN_CONFIG": str(tmp / "none.yaml"), "CLOUDTRAIN_STEP_REPORT_SECONDS": "0.5"}
        env.pop("CLOUDTRAIN_PROFILE", None)
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=tmp, env=env, capture_output=True,
                              text=True, timeout=240)

    proj = ddp_project(tmp)
    out = cli("submit", str(proj / "train_ddp.py"), "--procs-per-node", "2", "--max-restarts", "1", "--spot",
              "--checkpoint-uri", (tmp / "ckpt").as_uri(), "--detach", "--", "--epochs", "4",
              "--checkpoint-every", "10", "--step-sleep", "0.04")
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip().splitlines()[-1]
    wait_for(lambda: (status_json(cli, handle)["goodput"]["checkpoints"] or 0) >= 2, timeout=90)
    assert cli("preempt", handle).returncode == 0
    assert cli("wait", handle, "--timeout", "120").returncode == 0
    yield cli, handle, home
    stop_every_job(home)


def test_timeline_tells_the_whole_story(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, handle, _ = preempted_job
    found = status_json(cli, handle)
    events = found["timeline"]["events"]
    kinds = [e["e"] for e in events]
    for kind in ("submitted", "staged", "node_started", "step", "checkpoint", "preempted", "restored",
                 "training_again", "ended"):
        assert kind in kinds, (kind, kinds)
    order = [kinds.index("submitted"), kinds.index("preempted"), kinds.index("restored"),
             kinds.index("training_again"), kinds.index("ended")]
    assert order == sorted(order), kinds
    assert [e["attempt"] for e in events if e["e"] == "node_started"] == [0, 1]
    saved = next(e for e in events if e["e"] == "checkpoint")
    assert saved["bytes"] > 0 and saved["blocked_s"] >= 0 and saved["publish_s"] >= 0 and saved["step"] % 10 == 0
    restored = next(e for e in events if e["e"] == "restored")
    assert restored["bytes"] > 0 and restored["seconds"] >= 0 and restored["step"] > 0
    assert next(e for e in events if e["e"] == "ended")["state"] == "succeeded"
    assert found["timeline"]["missing"] == 0
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)


def test_progress_and_goodput_in_status(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, handle, _ = preempted_job
    found = status_json(cli, handle)
    progress, good = found["progress"], found["goodput"]
    assert progress["step"] == progress["total"] == 4 * 32  # 2048 samples, 2 ranks, batch 32, 4 epochs
    assert progress["source"] == "report_step" and progress["steps_per_s"] > 0 and progress["eta_s"] is None
    assert good["legs"] == 2 and good["preemptions"] == 1
    assert 0 < good["ratio"] <= 1
    assert good["kept_s"] < good["paid_s"]
    losses = good["losses_s"]
    assert losses["provisioning"] > 0 and losses["restore"] > 0 and losses["checkpoints"] > 0
    assert good["kept_s"] + sum(v for k, v in losses.items() if k != "waiting") == pytest.approx(good["paid_s"],
                                                                                                 abs=0.01)
    text = cli("status", handle).stdout
    assert "progress: step 128/128 (100%)" in text and f"goodput: {good['ratio']:.2f} of" in text


def test_openmetrics_parse_back(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, handle, _ = preempted_job
    good = status_json(cli, handle)["goodput"]
    for args in (("status", "-o", "openmetrics"), ("status", handle, "-o", "openmetrics")):
        out = cli(*args)
        assert out.returncode == 0, out.stderr
        assert out.stdout.endswith("# EOF\n")
        parsed = families(out.stdout)
        value = {s.name: s.value for samples in parsed.values() for s in samples if s.labels.get("handle") == handle
                 and "cause" not in s.labels and "cloudtrain_job_state" not in s.labels}
        assert value["cloudtrain_job_restarts_total"] == 1 and value["cloudtrain_job_preemptions_total"] == 1
        assert value["cloudtrain_job_step"] == 128
        assert value["cloudtrain_job_goodput_ratio"] == pytest.approx(good["ratio"])
        assert value["cloudtrain_job_checkpoint_age_seconds"] >= 0
        states = {s.labels["cloudtrain_job_state"]: s.value for s in parsed["cloudtrain_job_state"]}
        assert states["succeeded"] == 1 and sum(states.values()) == 1
        lost = {s.labels["cause"] for s in parsed["cloudtrain_job_lost_seconds"]}
        assert {"provisioning", "restore", "checkpoints"} <= lost


def test_torn_event_lines_are_missing_not_errors(preempted_job: tuple[Cli, str, Path]) -> None:
    """A node killed mid-write leaves half an event line; a torn line in the home's events file too."""
    cli, handle, home = preempted_job
    job_id = handle.split("://", 1)[1]
    with open(home / "jobs" / job_id / "node-0.log", "a") as log:
        log.write('[default0]:cloudtrain-event {"e":"checkpoint","t":17958')  # no newline: the writer was killed
    events_file = next((home / "events").glob("*.jsonl"))
    with open(events_file, "a") as f:
        f.write('{"e":"state","t":1\n')
    out = cli("status", handle)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "2 event line(s) cut short or unreadable are missing" in out.stdout
    assert status_json(cli, handle)["timeline"]["missing"] == 2
    assert cli("status", handle, "-o", "openmetrics").returncode == 0


def test_unknown_handle_and_no_handle_exit_2(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, _, _ = preempted_job
    for args in (("status", "local://no-such-job", "-o", "openmetrics"), ("status",)):
        out = cli(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "fix:" in out.stderr or "cloudtrain list" in out.stderr


def test_node_events_parse(tmp_path: Path) -> None:
    """Lines as the logs carry them: node and worker prefixes, a torn one, a line of another shape."""
    from cloudtrain.node.events import line
    from cloudtrain.timeline import node_events

    good = line("restored", step=5, bytes=10, seconds=0.5)
    found, missing = node_events([f"[node1] [default0]:{good}", "[node0] plain", "[node0] cloudtrain-event {\"e\"",
                                  'cloudtrain-event ["e", 1]', json.dumps({"e": "x"})])
    assert [(e["e"], e["node"], e["step"]) for e in found] == [("restored", 1, 5)] and missing == 2
