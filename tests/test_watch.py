"""``cloudtrain watch`` (issue 31.6): two watchers on one preempted Vertex job (the real JobServiceClient against the
local fake) resubmit it once between them, with the chain's state and lease in its checkpoint store on the GCS
emulator; a watcher restarted with an empty home picks the same chain up from the store and submits nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from cloudtrain.checkpoint import lineage
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState
from cloudtrain.jobs import recovery
from cloudtrain.jobs.watcher import Watched, watch
from cloudtrain.plan import cost
from cloudtrain.sdk import Job
from tests.conftest import cli_env, ended_local_job
from tests.emulators import BUCKET
from tests.fakes.vertex import VertexFake


@pytest.fixture(autouse=True)
def quick_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lineage, "SETTLE_SECONDS", 0.3)  # a lease's write-settle-read, shortened for tests


def test_two_watchers_resubmit_once_and_a_restarted_one_picks_up_the_chain(
        vertex: VertexFake, project: Path, ct_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = f"gs://{BUCKET}/watched-{uuid.uuid4().hex[:8]}"
    vertex.scripts = [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "PREEMPTED"],
                      ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", *["JOB_STATE_RUNNING"] * 10, "JOB_STATE_SUCCEEDED"]]
    run = Job(script="train_ddp.py", source_dir=str(project), spot=True, max_restarts=3,
              checkpoint={"uri": ckpt}).submit("gcp")
    results: dict[str, list[Watched]] = {}

    def watcher(name: str) -> None:
        results[name] = watch([run.handle], poll=0.05, owner=name, log=lambda _m: None)

    threads = [threading.Thread(target=watcher, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(vertex.jobs) == 2, vertex.jobs.keys()  # one resubmission between the two watchers
    for name in ("a", "b"):
        final = results[name][0].final
        assert final is not None and final.state is JobState.SUCCEEDED
    shared = lineage.read(lineage.state_uri(ckpt))
    assert shared is not None and len(shared["chain"]) == 2 and shared["chain"][0] == str(run.handle)

    # a watcher restarted elsewhere (an empty home) picks the chain up from the store: nothing new is submitted
    fresh_home = tmp_path / "elsewhere-home"
    said: list[str] = []
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(fresh_home))
    again = watch([JobHandle.parse(shared["chain"][0])], poll=0.05, owner="c", log=said.append)
    assert again[0].final is not None and again[0].final.state is JobState.SUCCEEDED
    assert len(vertex.jobs) == 2 and any("picked up its chain from" in line for line in said)

    # the CLI: exit 0 when every chain succeeded, one line per chain
    env = {**cli_env(fresh_home)}
    cli = subprocess.run([sys.executable, "-m", "cloudtrain", "watch", str(run.handle), "--poll", "0.05"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert f"{run.handle}: succeeded" in cli.stdout and len(vertex.jobs) == 2


def test_writers_of_one_record_at_once_never_trip_over_each_other(ct_home: Path) -> None:
    """Seen in the suite: two watchers attaching to one job at once both saved its recovery state through the same
    `<root>.tmp`; one renamed it away and the other's rename failed (FileNotFoundError), killing that watcher. Each
    write now has its own temporary file (as the stores' writes do); the same for the price record."""
    state = recovery.RecoveryState(root="gcp://p/r/1", max_restarts=3, chain=["gcp://p/r/1"])
    failures: list[BaseException] = []

    def write(n: int) -> None:
        for i in range(150):
            try:
                recovery.save(recovery.RecoveryState(**{**state.__dict__, "chain": [state.root, f"gcp://p/r/{n}{i}"]}))
                cost.write(state.root, {"handle": state.root, "rate": None, "max_cost": float(i)})
            except BaseException as exc:  # collected, asserted below
                failures.append(exc)
                return

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    saved = recovery.load(JobHandle.parse(state.root))
    assert saved is not None and saved.chain[0] == state.root  # whole: one writer's, never a mix
    assert sorted(p.name for p in recovery.state_dir().iterdir()) == ["gcp_p_r_1.json"]  # no temporary file left


# -- state in the store is checked before it is trusted (issue 38.9, 38.10) -----------------------------------------


def _watch(project: Path, home: Path, handle: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain", "watch", handle, "--poll", "0.2"], cwd=project,
                          env=cli_env(home), capture_output=True, text=True, timeout=timeout)


def test_a_chain_file_or_lease_of_another_shape_in_the_store_is_named_never_a_traceback(
        project: Path, ct_home: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    handle = ended_local_job(project, ct_home, store)
    folder = store / "_cloudtrain"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lease.json").write_text('{"owner": "elsewhere", "expires": "tomorrow"}')
    # this home has no chain of the job: a chain file it cannot use is refused by name, with the fix
    for content, wrong in ((json.dumps({"chain": [handle]}), "root is missing"),
                           (json.dumps([handle]), "holds list, not a JSON object"),
                           ("{not json", "is not valid JSON"),
                           (json.dumps({"root": handle, "max_restarts": 1, "chain": {"0": handle}}), "chain is {"),
                           (json.dumps({"root": handle, "max_restarts": "3", "chain": [handle]}),
                            "max_restarts is '3'; it must be a whole number"),
                           (json.dumps({"root": handle, "max_restarts": 0, "chain": [handle], "leg": 4,
                                        "legs": [{"provider": "local"}]}), "leg is 4, but legs lists 1")):
        (folder / "lineage.json").write_text(content)
        refused = _watch(project, ct_home, handle)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert f"{(folder / 'lineage.json').as_uri()}" in refused.stderr and wrong in refused.stderr, refused.stderr
        assert "fix: delete it" in refused.stderr
    # none there: the lease of another shape holds nothing (said), and the ended chain is seen as ended
    (folder / "lineage.json").unlink()
    watched = _watch(project, ct_home, handle)
    assert watched.returncode == 0 and "Traceback" not in watched.stderr, watched.stderr
    assert f"{(folder / 'lease.json').as_uri()} is not a lease cloudtrain wrote" in watched.stderr
    assert f"{handle}: succeeded" in watched.stdout
    # this home has the chain now: a chain file it cannot use is replaced by this home's copy
    (folder / "lineage.json").write_text(json.dumps({"chain": "x"}))
    again = _watch(project, ct_home, handle)
    assert again.returncode == 0, again.stderr
    assert "this home's copy of the chain replaces it" in again.stderr
    assert json.loads((folder / "lineage.json").read_text())["chain"] == [handle]


def test_a_lease_from_a_clock_years_ahead_or_on_an_ended_chain_blocks_no_watcher(
        project: Path, ct_home: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    handle = ended_local_job(project, ct_home, store)
    lease = store / "_cloudtrain" / "lease.json"
    lease.parent.mkdir(parents=True, exist_ok=True)
    for expires in (time.time() + 10 * 365 * 86400, time.time() + 100):  # a clock years ahead; a live watcher's
        lease.write_text(json.dumps({"owner": "other-host:1:abcd", "expires": expires}))
        try:
            watched = _watch(project, ct_home, handle, timeout=40)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a lease expiring in {expires - time.time():.0f}s blocked the watcher") from None
        assert watched.returncode == 0 and f"{handle}: succeeded" in watched.stdout, watched.stderr
    assert json.loads(lease.read_text())["owner"] == "other-host:1:abcd"  # a live lease is left to its owner


def test_a_lease_too_far_ahead_is_taken_over_and_the_preempted_job_resubmitted_once(
        vertex: VertexFake, project: Path, ct_home: Path) -> None:
    """The chain has not ended: the watcher whose clock ran ahead left its lease behind; another takes it over (said)
    and resubmits the preempted job, once."""
    ckpt = f"gs://{BUCKET}/ahead-{uuid.uuid4().hex[:8]}"
    vertex.scripts = [["JOB_STATE_PENDING", "PREEMPTED"], ["JOB_STATE_PENDING", "JOB_STATE_SUCCEEDED"]]
    run = Job(script="train_ddp.py", source_dir=str(project), spot=True, max_restarts=2,
              checkpoint={"uri": ckpt}).submit("gcp")
    state = lineage.state_uri(ckpt)
    lineage.write(state.rsplit("/", 1)[0] + "/lease.json",
                          {"owner": "ahead:1:feed", "expires": time.time() + 5 * 365 * 86400})
    said: list[str] = []
    done = watch([run.handle], poll=0.05, owner="b", log=said.append, rounds=200)
    final = done[0].final
    assert final is not None and final.state is JobState.SUCCEEDED and len(vertex.jobs) == 2
    assert any("further ahead than a lease lasts" in line and "not trusted" in line for line in said), said


def test_a_recovery_file_of_another_shape_in_the_home_is_named_never_a_traceback(
        project: Path, ct_home: Path, tmp_path: Path) -> None:
    """The same check for this home's copy (status, wait --recover and watch read it): another version's or a
    hand-edited one is refused by name, exit 2, with the fix."""
    handle = ended_local_job(project, ct_home, tmp_path / "store")
    kept = ct_home / "recovery" / "edited.json"
    kept.parent.mkdir(exist_ok=True)
    kept.write_text(json.dumps({"root": handle, "max_restarts": 0, "chain": [handle, "local://later-1"],
                                "history": [1, 2]}))
    for command in (["status", handle], ["wait", handle, "--recover"], ["watch", handle]):
        done = subprocess.run([sys.executable, "-m", "cloudtrain", *command], cwd=project, env=cli_env(ct_home),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{kept} is not a job chain's recovery state" in done.stderr and "history is [1, 2]" in done.stderr
