"""Issue 31.5, checkpoint before the reclaim: each node polls its platform's spot notice (EC2 instance-action with an
IMDSv2 token, Azure Scheduled Events' Preempt, GCE instance/preempted) at a fake metadata server on 127.0.0.1 that
CLOUDTRAIN_METADATA_URL points the node at, and asks its workers for a checkpoint at once: the runtime Checkpointer
and the documented plain script save at that step, long before their periodic checkpoint."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import contract, registry
from cloudtrain.checkpoint import store as checkpoints
from cloudtrain.node import spot_notice
from tests.conftest import REPO, status_json, wait_for
from tests.fakes.metadata import MetadataFake

SAGEMAKER, AZUREML, VERTEX, LOCAL = (registry.node_contract(name) for name in ("aws", "azure", "gcp", "local"))
KINDS = {"ec2": SAGEMAKER, "azure": AZUREML, "gce": VERTEX}
NOTICE_LINE = re.compile(r"\[cloudtrain\] spot notice from (\w+) at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ.*: asked the "
                         r"workers for a checkpoint")


@pytest.fixture
def fake() -> Iterator[MetadataFake]:
    server = MetadataFake()
    yield server
    server.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the socket is: connection refused


# -- the poller against the fake endpoints --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_platforms_notice_is_read_as_its_docs_say(fake: MetadataFake, kind: str) -> None:
    probe = spot_notice.Probe(kind, fake.url)
    assert probe() is None and probe() is None  # no reclaim scheduled
    fake.announce()
    notice = probe()
    assert notice is not None and notice["action"] in ("terminate", "preempt")
    if kind == "ec2":  # one IMDSv2 token for every poll, sent as its header; the TTL asked for on the PUT
        puts = [r for r in fake.requests if r[0] == "PUT"]
        assert len(puts) == 1 and puts[0][2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
        gets = [r for r in fake.requests if r[0] == "GET"]
        assert len(gets) == 3 and {g[2]["x-aws-ec2-metadata-token"] for g in gets} == {"token-0"}
        assert notice["at"] == "2026-01-01T00:02:00Z"
    elif kind == "azure":
        assert all(r[2]["metadata"] == "true" and "api-version=2020-07-01" in r[1] for r in fake.requests)
        assert notice["at"] == "Thu, 01 Jan 2026 00:00:30 GMT"
    else:
        assert all(r[2]["metadata-flavor"] == "Google" for r in fake.requests)


def test_a_notice_writes_the_request_and_says_so_once(fake: MetadataFake, tmp_path: Path, capsys) -> None:
    request = tmp_path / "checkpoint-request.json"
    watch = spot_notice.NoticeWatch(spot_notice.Probe("ec2", fake.url), "sagemaker", request, None, every=0.05)
    watch.start()
    time.sleep(0.3)
    assert not request.exists()  # polled, nothing announced
    fake.announce()
    wait_for(request.exists, timeout=5, interval=0.02)
    watch._thread.join(5)
    asked = json.loads(request.read_text())
    assert asked["platform"] == "sagemaker" and asked["action"] == "terminate"
    out = capsys.readouterr().out
    assert len(NOTICE_LINE.findall(out)) == 1, out
    assert "token-" not in out and "token-" not in request.read_text()  # no token in the log or the file


def test_an_absent_endpoint_is_one_line_and_no_more_polls(tmp_path: Path, capsys) -> None:
    watch = spot_notice.NoticeWatch(spot_notice.Probe("gce", closed_port()), "vertex", tmp_path / "r.json", None,
                                    every=0.05)
    watch.start()._thread.join(5)
    assert not watch._thread.is_alive() and not (tmp_path / "r.json").exists()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[cloudtrain] spot notices: vertex's notice endpoint "), lines
    assert lines[0].endswith("not polling it")


def test_which_nodes_poll() -> None:
    """Azure ML and Vertex poll by default; SageMaker only when asked (no documented IMDS access from its training
    containers); the plain local contract has no notice; CLOUDTRAIN_METADATA_URL=off turns polling off."""
    assert spot_notice.enabled(AZUREML, {}) == "azure" and spot_notice.enabled(VERTEX, {}) == "gce"
    assert spot_notice.enabled(SAGEMAKER, {}) is None
    assert spot_notice.enabled(SAGEMAKER, {contract.SPOT_NOTICE: "on"}) == "ec2"
    assert spot_notice.enabled(AZUREML, {contract.SPOT_NOTICE: "off"}) is None
    assert spot_notice.enabled(VERTEX, {contract.METADATA_URL: "off"}) is None
    assert spot_notice.enabled(LOCAL, {contract.SPOT_NOTICE: "on"}) is None


# -- real local jobs under each platform's contract -----------------------------------------------------------------


def project(tmp_path: Path, name: str, text: str) -> str:
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / name).write_text(text)
    return str(proj / name)


def documented_plain_script() -> str:
    doc = (REPO / "docs" / "checkpoints.md").read_text()
    return doc.split("### A minimal plain script that saves and resumes", 1)[1].split("```python\n", 1)[1] \
        .split("```", 1)[0]


def run_with_notice(cli, fake: MetadataFake, script: str, platform: str, *args: str) -> tuple[str, dict]:
    """Submit under ``platform``'s contract with the node pointed at the fake; the notice appears 6 s after the
    node's first poll (which starts with torchrun: mid-run, or, on a crowded machine, before the first step, which
    then saves). Returns the job's log and status."""
    env = ["--env", f"{contract.METADATA_URL}={fake.url}", "--env", f"{contract.SPOT_NOTICE}=on"]
    handle = cli("submit", script, "--detach", "--procs-per-node", "2", "--emulate", platform, *env, *args)
    handle_id = handle.stdout.strip()
    assert handle_id.startswith("local://"), handle.stdout + handle.stderr
    wait_for(lambda: any(r[0] == "GET" for r in fake.requests), timeout=180, interval=0.1)
    fake.announce(after=6)
    assert cli("wait", handle_id, "--timeout", "240").returncode == 0, cli("logs", handle_id).stdout[-4000:]
    return cli("logs", handle_id).stdout, status_json(cli, handle_id)


@pytest.mark.slow
@pytest.mark.parametrize(("platform", "kind"), [("sagemaker", "ec2"), ("azureml", "azure"), ("vertex", "gce")])
def test_the_checkpointer_saves_at_the_notice(cli, fake: MetadataFake, tmp_path: Path, platform: str,
                                              kind: str) -> None:
    """The reference trainer (Checkpointer, 2 gloo ranks, no periodic checkpoint within the run) gets a notice
    mid-run: every rank saves that step, training goes on, and the store holds that step and the last."""
    ckpt = (tmp_path / "ckpt").as_uri()
    script = project(tmp_path, "train_ddp.py", (REPO / "entrypoints" / "train_ddp.py").read_text())
    log, status = run_with_notice(cli, fake, script, platform, "--checkpoint-uri", ckpt, "--set",
                                  "checkpoint.interval=1h", "--", "--epochs", "3", "--step-sleep", "0.2")
    assert status["state"] == "succeeded"
    assert NOTICE_LINE.findall(log) == [platform], log[-4000:]
    asked = re.search(r"checkpoint requested by the node \(a spot notice\): saving step (\d+)", log)
    assert asked, log[-4000:]
    steps = [c.step for c in checkpoints.list_complete(ckpt)]
    assert steps == [int(asked.group(1)), 96] and int(asked.group(1)) < 90, (steps, log[-3000:])
    assert {r[1].split("?")[0] for r in fake.requests if r[0] == "GET"} == {spot_notice.PATHS[kind].split("?")[0]}


@pytest.mark.slow
def test_the_documented_plain_script_saves_at_the_notice(cli, fake: MetadataFake, tmp_path: Path) -> None:
    """The plain script from docs/checkpoints.md reads CLOUDTRAIN_CHECKPOINT_REQUEST at each step and saves then,
    well before its --save-every."""
    ckpt = (tmp_path / "ckpt").as_uri()
    script = project(tmp_path, "train_plain.py", documented_plain_script())
    log, status = run_with_notice(cli, fake, script, "azureml", "--checkpoint-uri", ckpt,
                                  "--", "--steps", "150", "--save-every", "1000", "--step-sleep", "0.1")
    assert status["state"] == "succeeded" and NOTICE_LINE.findall(log) == ["azureml"], log[-4000:]
    asked = re.search(r"rank 0: saved step (\d+) \(asked by the node\)", log)
    assert asked and int(asked.group(1)) < 140, log[-4000:]
    assert [c.step for c in checkpoints.list_complete(ckpt)] == [int(asked.group(1)), 150]


@pytest.mark.slow
def test_no_endpoint_no_change(cli, tmp_path: Path) -> None:
    """Without a metadata server the job runs as before: one line where a notice was to be polled (the endpoint does
    not answer), none at all where none is (an emulated node with no CLOUDTRAIN_METADATA_URL, a local node)."""
    script = project(tmp_path, "train_plain.py", documented_plain_script())
    args = ["--procs-per-node", "2", "--", "--steps", "20", "--save-every", "10"]
    absent = cli("submit", script, "--emulate", "vertex", "--env", f"{contract.METADATA_URL}={closed_port()}", *args)
    assert absent.returncode == 0, absent.stdout[-3000:] + absent.stderr
    lines = [line for line in absent.stdout.splitlines() if "spot notice" in line]
    assert len(lines) == 1 and "vertex's notice endpoint" in lines[0] and "not polling it" in lines[0], lines
    assert "asked by the node" not in absent.stdout
    for extra in (["--emulate", "azureml"], []):
        quiet = cli("submit", script, *extra, *args)
        assert quiet.returncode == 0 and "spot notice" not in quiet.stdout, quiet.stdout[-3000:] + quiet.stderr
