"""``cloudtrain watch`` (issue 31.6): two watchers on one preempted Vertex job (the real JobServiceClient against the
local fake) resubmit it once between them, with the chain's state and lease in its checkpoint store on the GCS
emulator; a watcher restarted with an empty home picks the same chain up from the store and submits nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from cloudtrain import cost, lineage_store, recovery
from cloudtrain.handles import JobHandle
from cloudtrain.providers.base import JobState
from cloudtrain.sdk import Job
from cloudtrain.watch import Watched, watch
from tests.conftest import cli_env
from tests.emulators import BUCKET
from tests.test_gcp import vertex  # noqa: F401  (the Vertex fake with its settings; a fixture)
from tests.vertex_fake import VertexFake


@pytest.fixture(autouse=True)
def quick_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lineage_store, "SETTLE_SECONDS", 0.3)  # a lease's write-settle-read, shortened for tests


def test_two_watchers_resubmit_once_and_a_restarted_one_picks_up_the_chain(
        vertex: VertexFake, project: Path, ct_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
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
    shared = lineage_store.read(lineage_store.state_uri(ckpt))
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
