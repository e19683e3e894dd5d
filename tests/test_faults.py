"""Storage faults: the checkpoint protocol through a fault-injecting proxy in front of each storage emulator.

Real parts only: moto's S3 server, gcp-storage-emulator and Azurite, reached by boto3, google-cloud-storage and
azure-storage-blob through ``tests/faultproxy.py``, which resets connections, answers 500/503 (S3 SlowDown),
delays and truncates responses. What must hold: an upload that returned was published whole and restores
bit-exact; one that failed left no manifest, and restore falls back to the newest complete checkpoint; retention
never removes the newest complete one; no acknowledged checkpoint is lost.

``pytest -s`` prints one report line per backend; CLOUDTRAIN_FAULT_REPORT=path also writes them as JSON.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import retention as checkpoint_retention
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.errors import CloudtrainError
from tests.emulators import Emulator, ensure
from tests.faultproxy import KINDS, FaultPlan, FaultProxy, Request
from tests.faulty import MIB, PLAN, Faulty

# One file per checkpoint above the size at which each client switches to its multi-request upload: the store's own
# 16 MiB S3 multipart threshold, GCS's 8 MiB resumable threshold, the 4 MiB single-put limit set for Azure (see
# tests/faulty.py).
SHARD_BYTES = {"s3": 17 * MIB, "gs": 9 * MIB, "az": 9 * MIB}
KEEP = 2
REPORT: dict[str, dict[str, Any]] = {}


def _make_checkpoint(local: Path, step: int, shard_bytes: int) -> tuple[Path, list[dict[str, Any]]]:
    folder = local / checkpoint_store.step_dir(step)
    (folder / "extra").mkdir(parents=True, exist_ok=True)
    (folder / "__0_0.distcp").write_bytes(random.Random(step).randbytes(shard_bytes))
    (folder / "extra" / "rank-0.pt").write_bytes(f"rng-{step}".encode() * 64)
    return folder, checkpoint_store.describe_files(folder, ["__0_0.distcp", "extra/rank-0.pt"])


def _save(folder: Path, files: list[dict[str, Any]], root: str, step: int, log: Callable[[str], None]) -> None:
    """What the Checkpointer does after a save: upload, publish (manifest last), then retention."""
    remote = storage.join(root, checkpoint_store.step_dir(step))
    checkpoint_store.upload_files(folder, files, remote, log=log)
    checkpoint_store.publish(remote, step, files, world_size=1, log=log)
    storage.with_retries(lambda: checkpoint_retention.apply_retention(root, KEEP, log=log), f"retention under {root}",
                         log=log)


def _has_manifest(root: str, step: int) -> bool:
    return storage.exists(storage.join(root, checkpoint_store.step_dir(step), checkpoint_store.MANIFEST))


def _publish_report(row: dict[str, Any]) -> None:
    REPORT[row["backend"]] = row
    faults = " ".join(f"{k}={v}" for k, v in sorted(row["faults"].items()))
    print(f"\n[faults] {row['backend']}: requests={row['requests']} faults={row['faults_total']} ({faults}) "
          f"retried={row['retried']} (cloudtrain={row['retried_cloudtrain']} client={row['retried_client']}) "
          f"published={row['published']} not_published={row['not_published']} lost={row['lost']} "
          f"restored=step-{row['restored_step']} in {row['seconds']:.1f}s")
    if path := os.environ.get("CLOUDTRAIN_FAULT_REPORT"):
        Path(path).write_text(json.dumps(REPORT, indent=1, sort_keys=True))


@pytest.mark.slow
@pytest.mark.parametrize("faulty", ["s3", "gs", "az"], indirect=True)
def test_checkpoints_survive_storage_faults(faulty: Faulty, tmp_path: Path) -> None:
    started = time.monotonic()
    proxy, root = faulty.proxy, faulty.root
    messages: list[str] = []
    published: list[int] = []  # save returned: the caller was told the checkpoint exists
    not_published: list[int] = []
    lost: set[int] = set()  # published, yet missing or not verifying when it should be there
    sources: dict[int, Path] = {}

    def verify(step: int, complete: dict[int, checkpoint_store.Checkpoint]) -> None:
        try:  # download checks every file's size and sha256 against the manifest
            checkpoint_store.download(complete[step], tmp_path / "verify" / checkpoint_store.step_dir(step))
        except (KeyError, ValueError, OSError, CloudtrainError):
            lost.add(step)

    for step in (10, 20, 30):
        folder, files = _make_checkpoint(tmp_path / "local", step, SHARD_BYTES[faulty.scheme])
        sources[step] = folder
        try:
            _save(folder, files, root, step, messages.append)
            published.append(step)
        except CloudtrainError:
            not_published.append(step)
        with proxy.calm():  # read back the ground truth
            complete = {c.step: c for c in checkpoint_store.list_complete(root, log=messages.append)}
            if step in published:
                verify(step, complete)
            else:
                assert not _has_manifest(root, step), f"step {step} failed yet has a manifest"
            if published:
                assert max(complete) == published[-1], "retention or a fault removed the newest complete"
    assert len(published) >= 2, f"too few checkpoints survived transient faults: {not_published} failed"

    # An outage beyond every retry budget while the shard of step 40 is already up: it must stay unpublished.
    folder, files = _make_checkpoint(tmp_path / "local", 40, SHARD_BYTES[faulty.scheme])
    refused = f"{checkpoint_store.step_dir(40)}/extra/"
    with (proxy.fail_matching(lambda r: r.method in ("PUT", "POST") and r.mentions(refused)),
          pytest.raises(CloudtrainError, match="failed after 5 attempts")):
        _save(folder, files, root, 40, messages.append)
    not_published.append(40)

    # Read back with the proxy calm: reads under faults are test_restore_survives_a_read_cut_short's business.
    with proxy.calm():
        uploaded = storage.store_for(root).list(storage.join(root, checkpoint_store.step_dir(40)))
        assert [u.rsplit("/", 1)[1] for u in uploaded] == ["__0_0.distcp"], "step 40 should be left partial"
        assert not _has_manifest(root, 40)
        complete = {c.step: c for c in checkpoint_store.list_complete(root, log=messages.append)}
        assert not set(complete) & set(not_published)
        assert sorted(complete) == published[-KEEP:], "retention kept the wrong checkpoints"
        for step in published[-KEEP:]:
            verify(step, complete)
        found = checkpoint_restore.restore_latest(root, tmp_path / "restore", log=messages.append)
    assert found is not None and found.step == published[-1], "restore must take the newest complete checkpoint"
    restored = tmp_path / "restore" / checkpoint_store.step_dir(found.step) / "__0_0.distcp"
    assert restored.read_bytes() == (sources[found.step] / "__0_0.distcp").read_bytes()
    assert not lost, f"published checkpoints lost: {sorted(lost)}"

    missing = [k for k in PLAN.kinds if proxy.injected[k] == 0]
    assert not missing, f"no {missing} fault was injected in {proxy.requests} requests"
    assert proxy.injected["http_403"] >= 5, "every attempt at the refused upload must have reached the storage"
    retried_cloudtrain = sum(" failed (" in m and "; retry " in m for m in messages)
    retried_client = faulty.client_retries.value
    assert retried_cloudtrain >= 4, "cloudtrain must retry the refused upload before giving up"
    assert retried_client + retried_cloudtrain - 4 > 0, "transient faults were absorbed without a single retry?"
    _publish_report({
        "backend": faulty.scheme, "requests": proxy.requests, "faults": dict(proxy.injected),
        "faults_total": proxy.faults, "retried": retried_cloudtrain + retried_client,
        "retried_cloudtrain": retried_cloudtrain, "retried_client": retried_client, "published": len(published),
        "not_published": len(not_published), "lost": len(lost), "restored_step": found.step,
        "seconds": round(time.monotonic() - started, 1),
    })


def _manifest_read(request: Request) -> bool:
    """The GET of a manifest's content (S3/Azure: the object path; GCS: ``.../o/<name>?alt=media``)."""
    return request.method == "GET" and request.mentions(checkpoint_store.MANIFEST)


def _listing(request: Request) -> bool:
    """S3 ListObjectsV2, Azure List Blobs, GCS objects.list."""
    target = request.target.split("?")[0]
    return request.method == "GET" and ("list-type=2" in request.target or "comp=list" in request.target
                                        or target.endswith("/o"))


# boto3 retries a listing cut short (the body is read inside the call) but not an object body read after it returned:
# list_complete retries its manifest reads itself, which the s3 manifest case proves.
_READ_FAULTS = [pytest.param(scheme, what, kind, id=f"{scheme}-{what.__name__.strip('_')}-{kind}")
                for scheme in ("s3", "gs", "az")
                for what, kind in ((_manifest_read, "truncate"), (_listing, "reset_mid"))]


def _publish_small(root: str, tmp_path: Path, steps: tuple[int, ...]) -> None:
    for step in steps:
        folder, files = _make_checkpoint(tmp_path / "local", step, 64 * 1024)
        remote = storage.join(root, checkpoint_store.step_dir(step))
        checkpoint_store.upload_files(folder, files, remote)
        checkpoint_store.publish(remote, step, files, world_size=1)


@pytest.mark.parametrize("faulty", ["gs", "az"], indirect=True)
def test_retention_sends_a_checkpoints_deletes_at_once(faulty: Faulty, tmp_path: Path) -> None:
    """Retention removes a whole checkpoint after each publish, and the next save (the final one at a SIGTERM too)
    waits for it. GCS and Azure delete each object with a request of its own, and those went one after another: one
    round trip per file of the checkpoint (hundreds on a large FSDP job). Now they are in flight together; the
    manifest still goes first, on its own, so a half-deleted checkpoint is never taken for a complete one."""
    names = [f"__{rank}_{i}.distcp" for rank in range(6) for i in range(2)] + \
        [f"extra/rank-{rank}.pt" for rank in range(6)]
    with faulty.proxy.calm():
        for step in (10, 20, 30):
            folder = tmp_path / "local" / checkpoint_store.step_dir(step)
            for name in names:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(f"{step}-{name}".encode() * 16)
            files = checkpoint_store.describe_files(folder, names)
            remote = storage.join(faulty.root, checkpoint_store.step_dir(step))
            checkpoint_store.upload_files(folder, files, remote)
            checkpoint_store.publish(remote, step, files, world_size=6)
    deleting = lambda request: request.method == "DELETE"  # noqa: E731
    with faulty.proxy.calm(), faulty.proxy.fail_matching(deleting, kind="slow"):  # each answer 0.3 s late
        removed = checkpoint_retention.apply_retention(faulty.root, 2, log=lambda _m: None)
    assert removed == [10]
    assert storage.store_for(faulty.root).list(storage.join(faulty.root, checkpoint_store.step_dir(10))) == []
    sent = [(t, unquote(target.split("?")[0])) for t, method, target in faulty.proxy.arrived if method == "DELETE"]
    answered = [(t, unquote(target.split("?")[0])) for t, method, target, status in faulty.proxy.trace
                if method == "DELETE" and status.isdigit()]
    manifest = [t for t, target in answered if target.endswith("manifest.json")]
    files_sent = [t for t, target in sent if not target.endswith("manifest.json")]
    assert len(manifest) == 1 and len(files_sent) == len(names), (sent, answered)
    assert min(files_sent) > manifest[0], "the manifest must be gone before any of its files"
    first_file_answer = min(t for t, target in answered if not target.endswith("manifest.json"))
    at_once = sum(1 for t in files_sent if t < first_file_answer)
    assert at_once >= 4, f"{at_once} delete(s) were sent before the first answer; one after another sends 1"


@pytest.mark.parametrize("faulty", ["gs", "az"], indirect=True)
def test_a_delete_the_store_refuses_is_raised_once_the_others_are_done(faulty: Faulty, tmp_path: Path) -> None:
    """With the deletes in flight together, one refused must still fail the call (retention then retries, and says
    so), an object already gone must not, and the others are deleted, none left in flight when it raises."""
    store = storage.store_for(faulty.root)
    uris = [storage.join(faulty.root, f"doomed/{i}.bin") for i in range(12)]
    with faulty.proxy.calm():
        for uri in uris:
            store.write_bytes(uri, b"x")
        refused = lambda request: request.method == "DELETE" and request.mentions("doomed/5.bin")  # noqa: E731
        with faulty.proxy.fail_matching(refused, kind="http_403"), pytest.raises(Exception) as caught:
            store.delete([*uris, storage.join(faulty.root, "doomed/never-existed.bin")])
        assert "injected fault" in str(caught.value), repr(caught.value)  # the proxy's refusal, not another error
        assert store.list(storage.join(faulty.root, "doomed")) == [uris[5]]


@pytest.mark.parametrize(("faulty", "what", "kind"), _READ_FAULTS, indirect=["faulty"])
def test_restore_survives_a_read_cut_short(faulty: Faulty, what: Callable[[Request], bool], kind: str,
                                           tmp_path: Path) -> None:
    """One transient fault on a read restore depends on must not stop (or downgrade) the restore."""
    with faulty.proxy.calm():
        _publish_small(faulty.root, tmp_path, (10, 20))
    with faulty.proxy.calm(), faulty.proxy.fail_matching(what, kind=kind, times=1):
        found = checkpoint_restore.restore_latest(faulty.root, tmp_path / "restore", log=lambda _m: None)
    assert faulty.proxy.injected[kind] == 1
    assert found is not None and found.step == 20


@pytest.mark.parametrize("kind", KINDS)
def test_every_fault_kind_reaches_a_client_that_does_not_retry(kind: str, emulators: dict[str, Emulator | str],
                                                               tmp_path_factory: pytest.TempPathFactory,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's faults are real failures, not something an HTTP stack shrugs off; and it relays cleanly."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    ensure("s3", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    emulator = emulators["s3"]
    assert isinstance(emulator, Emulator)
    proxy = FaultProxy(emulator.port, flavor="s3", plan=FaultPlan(rate=0.0)).start()
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{proxy.port}",
                              config=Config(retries={"total_max_attempts": 1}))
        key = f"probe/{kind}.bin"
        client.put_object(Bucket="cloudtrain-test", Key=key, Body=b"x" * 4096)
        assert client.get_object(Bucket="cloudtrain-test", Key=key)["Body"].read() == b"x" * 4096
        with proxy.fail_matching(lambda r: r.method == "GET", kind=kind, times=1):
            if kind == "slow":
                started = time.monotonic()
                assert client.get_object(Bucket="cloudtrain-test", Key=key)["Body"].read() == b"x" * 4096
                assert time.monotonic() - started >= proxy.plan.delay
            else:
                with pytest.raises((BotoCoreError, ClientError)) as failure:
                    client.get_object(Bucket="cloudtrain-test", Key=key)["Body"].read()
                if kind == "http_503":
                    assert isinstance(failure.value, ClientError)
                    assert failure.value.response["Error"]["Code"] == "SlowDown"
        assert proxy.injected == {kind: 1} and proxy.requests == 3
        # the same keep-alive client goes on working once the fault is over
        assert client.get_object(Bucket="cloudtrain-test", Key=key)["Body"].read() == b"x" * 4096
    finally:
        proxy.stop()


@pytest.mark.parametrize("faulty", ["s3", "gs", "az"], indirect=True)
def test_a_bit_flipped_in_transit_does_not_condemn_a_good_checkpoint(faulty: Faulty, tmp_path: Path) -> None:
    """A reply whose body was spoiled on the way (the length is right, one bit is not) fails the sha256 check; the
    restore downloads the file again before it calls the checkpoint corrupt, so a good checkpoint is restored and
    never quarantined. (Clients that verify checksums themselves catch it first and retry: same outcome.)"""
    with faulty.proxy.calm():
        _publish_small(faulty.root, tmp_path, (10, 20))
        shard = f"{checkpoint_store.step_dir(20)}/__0_0.distcp"
        messages: list[str] = []
        with faulty.proxy.fail_matching(lambda r: r.method == "GET" and r.mentions(shard), kind="flip", times=1):
            found = checkpoint_restore.restore_latest(faulty.root, tmp_path / "restore", log=messages.append)
        assert faulty.proxy.injected["flip"] == 1
        assert found is not None and found.step == 20, messages
        assert not [m for m in messages if "corrupt" in m], messages
        names = storage.store_for(faulty.root).list(storage.join(faulty.root, checkpoint_store.step_dir(20)))
        assert not [n for n in names if "quarantine" in n]
    restored = tmp_path / "restore" / checkpoint_store.step_dir(20) / "__0_0.distcp"
    assert restored.read_bytes() == (tmp_path / "local" / checkpoint_store.step_dir(20) / "__0_0.distcp").read_bytes()


def _job(cli: Callable[..., Any], proj: Path, script: str, root: str, *args: str) -> tuple[str, dict[str, Any]]:
    """Submit a local job in the foreground; (handle, status as `status -o json` shows it)."""
    run = cli("submit", str(proj / script), "--procs-per-node", "2", "--checkpoint-uri", root, *args, timeout=300)
    submitted = [line.split()[1] for line in (run.stdout + run.stderr).splitlines() if line.startswith("submitted ")]
    assert submitted, run.stdout[-3000:] + run.stderr[-3000:]
    handle = submitted[0]
    status = json.loads(cli("status", handle, "-o", "json").stdout)
    return handle, status


def _refuse_writes(request: Request) -> bool:
    return request.method in ("PUT", "POST")  # what a read-only credential meets: 403 AccessDenied


@pytest.mark.slow
@pytest.mark.parametrize("faulty", ["s3"], indirect=True)
def test_plain_script_job_whose_checkpoints_cannot_be_published_fails(faulty: Faulty, cli: Callable[..., Any],
                                                                      tmp_path: Path) -> None:
    """Issue 15.5: a plain-script job against a store it cannot write to ends failed (not succeeded with a warning),
    `wait` exits 1, and the job says where the checkpoint files still are."""
    from tests.conftest import SCRIPTS

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "plain_checkpoints.py").write_text((SCRIPTS / "plain_checkpoints.py").read_text())
    with faulty.proxy.calm(), faulty.proxy.fail_matching(_refuse_writes):
        handle, status = _job(cli, proj, "plain_checkpoints.py", faulty.root)
    assert status["state"] == "failed", status
    assert "not published to" in status["message"] and "AccessDenied" in status["message"], status["message"]
    where = Path(status["message"].split("the files are still in ")[1].split()[0].rstrip(";"))
    assert sorted(p.name for p in where.iterdir()) == ["step-0001", "step-0002", "step-0003"]
    assert cli("wait", handle).returncode == 1
    node = json.loads((Path(status["job_dir"]) / "node-0.status.json").read_text())
    assert node["outcome"] == "failed" and "not published" in node["error"]
    with faulty.proxy.calm():
        assert checkpoint_store.list_complete(faulty.root) == []


@pytest.mark.slow
@pytest.mark.parametrize("faulty", ["s3"], indirect=True)
def test_checkpointer_job_whose_last_checkpoint_is_refused_fails_on_every_rank(faulty: Faulty, cli: Callable[..., Any],
                                                                               tmp_path: Path) -> None:
    """Issue 15.5, the runtime Checkpointer: the store refuses the manifest of the final checkpoint (taken by
    close(), issue 17.2), which only rank 0 writes. Every rank learns it (none hangs), the job ends failed, and the
    message names the step and the folder that still holds it."""
    from tests.conftest import REPO

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train_ddp.py").write_text((REPO / "entrypoints" / "train_ddp.py").read_text())
    # 2048 samples / (32 x 2): 32 steps per epoch
    manifest = f"{checkpoint_store.step_dir(32)}/{checkpoint_store.MANIFEST}"
    with faulty.proxy.calm(), faulty.proxy.fail_matching(lambda r: _refuse_writes(r) and r.mentions(manifest)):
        handle, status = _job(cli, proj, "train_ddp.py", faulty.root, "--", "--epochs", "1")
    assert status["state"] == "failed", status
    message = status["message"]
    assert "checkpoint step 32 was not saved to" in message and "AccessDenied" in message, message
    folder = Path(message.split("its files are still in ")[1].split()[0])
    assert folder.name == checkpoint_store.step_dir(32) and (folder / ".metadata").is_file()
    assert cli("wait", handle).returncode == 1
    logs = cli("logs", handle).stdout
    for rank in (0, 1):  # both ranks raised it (torch prefixes each worker's stderr with its rank), no hang
        assert f"[rank{rank}]: cloudtrain.runtime.checkpointer.CheckpointNotPublished: checkpoint step 32" in logs, \
            logs[-4000:]
    with faulty.proxy.calm():
        assert checkpoint_store.list_complete(faulty.root) == []


@pytest.mark.parametrize("faulty", ["s3"], indirect=True)
def test_final_model_upload_refused_says_where_the_model_is(faulty: Faulty, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch.distributed as dist

    from cloudtrain.runtime import save_final_model

    monkeypatch.setenv("CLOUDTRAIN_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    dist.init_process_group("gloo", init_method=(tmp_path / "pg").as_uri(), rank=0, world_size=1)
    try:
        with faulty.proxy.calm(), faulty.proxy.fail_matching(_refuse_writes), \
                pytest.raises(CloudtrainError, match=r"AccessDenied.*; the model is still in (\S+)") as failure:
            save_final_model(torch.nn.Linear(4, 1), uri=storage.join(faulty.root, "out"))
    finally:
        dist.destroy_process_group()
    kept = Path(failure.value.message.rsplit("the model is still in ", 1)[1])
    assert kept.is_file() and set(torch.load(kept, weights_only=True)) == {"weight", "bias"}


SWALLOWS_THE_ERROR = """
import torch
from cloudtrain.runtime import Checkpointer, init_distributed, shutdown

ctx = init_distributed()
model = torch.nn.Linear(4, 1)
ckpt = Checkpointer(model, torch.optim.SGD(model.parameters(), lr=0.1))
ckpt.step(1)
try:
    ckpt.close()  # saves step 1; the store refuses it
except RuntimeError as exc:
    print(f"swallowed {type(exc).__name__}", flush=True)
shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("faulty", ["s3"], indirect=True)
def test_a_script_that_swallows_the_checkpoint_error_still_fails(faulty: Faulty, cli: Callable[..., Any],
                                                                 tmp_path: Path) -> None:
    """The Checkpointer's rank 0 leaves .cloudtrain-unpublished.json; the bootstrap's final step reads it, so a
    script that catches CheckpointNotPublished and exits 0 does not make the job succeed."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "swallows.py").write_text(SWALLOWS_THE_ERROR)
    with faulty.proxy.calm(), faulty.proxy.fail_matching(_refuse_writes):
        handle, status = _job(cli, proj, "swallows.py", faulty.root)
    logs = cli("logs", handle).stdout
    assert logs.count("swallowed CheckpointNotPublished") == 2, logs[-3000:]
    assert status["state"] == "failed" and "checkpoint step 1 was not saved to" in status["message"], status
    assert cli("wait", handle).returncode == 1
