"""Checkpoint restore and upload against each storage SDK's own best transfer of the same bytes, in the same run.

    python benchmarks/transfer.py [--stores s3,gs,az] [--parts restore,upload] [--big-mb 320] [--small 96]
                                  [--small-mb 2] [--repeat 5]

A sharded checkpoint (one large file and many small ones, >= 500 MB by default) is published once to each emulator
(moto's S3 server, gcp-storage-emulator, Azurite; started as tests/emulators.py starts them, on 127.0.0.1). Then, per
store, interleaved so that both sides see the same emulator state and machine load:

(a) restore: ``python -m cloudtrain.checkpoint restore URI DIR`` (list, read the manifest, download, verify
    every sha256, move into place: a whole process) vs a whole process that downloads the same objects with the SDK's
    best transfer: boto3's TransferManager (every file submitted at once), google-cloud-storage's transfer_manager (or
    its plain serial download), azure-storage-blob's concurrent download. Each SDK is tried in each of its
    configurations once and the fastest one is the baseline. Target >= 1.0x (throughput, baseline / cloudtrain).
(b) upload: cloudtrain's ``upload_files`` of the same folder (what a checkpoint upload runs) vs the SDK's best
    upload of it, both whole processes; GCS's configurations include sending a large file in one chunk of its
    resumable upload (``chunk_size``), as cloudtrain does. Target >= 1.0x. For information, ``describe_and_upload``
    too (each file hashed while the uploads run: what the Checkpointer does once DCP has written a checkpoint).

Each side's line ends with the median CPU seconds of its own process and of the emulator's process during its runs:
where the emulator is busy for most of both sides' wall time, it is the limit, not the client. Runs alternate (ABBA)
and every upload is deleted after it (an emulator slows down as it fills up). Prints the median
of each side, the spread (min-max), the ratio of medians and the median of the paired ratios; this machine is shared
and noisy, so run it more than once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUCKET = "cloudtrain-test"
MB = 1 << 20


# -- the SDKs' own transfers, each run in a process of its own (``--baseline VARIANT SPEC``) -----------------------


def _s3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(max_pool_connections=32))


def _s3_download(files: list[dict[str, Any]], dest: Path, variant: str) -> None:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    # the default (8 MiB ranged parts), or whole objects (no ranged GETs), 10 at a time either way
    config = TransferConfig() if variant == "default" else TransferConfig(multipart_threshold=1 << 40)
    with TransferManager(_s3_client(), config) as manager:
        futures = [manager.download(BUCKET, f["key"], str(dest / f["path"])) for f in files]
        for future in futures:
            future.result()


def _s3_upload(files: list[dict[str, Any]], source: Path, prefix: str, variant: str) -> None:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    config = TransferConfig() if variant == "default" else TransferConfig(multipart_threshold=16 * MB,
                                                                          multipart_chunksize=16 * MB)
    with TransferManager(_s3_client(), config) as manager:
        futures = [manager.upload(str(source / f["path"]), BUCKET, f"{prefix}/{f['path']}") for f in files]
        for future in futures:
            future.result()


def _gcs_bucket() -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    return gcs.Client(project="local", credentials=AnonymousCredentials()).bucket(BUCKET)


def _gcs_download(files: list[dict[str, Any]], dest: Path, variant: str) -> None:
    from google.cloud.storage import transfer_manager

    bucket = _gcs_bucket()
    if variant == "serial":
        for f in files:
            bucket.blob(f["key"]).download_to_filename(str(dest / f["path"]))
        return
    large = [f for f in files if f["size"] >= 64 * MB] if variant == "chunks" else []
    for f in large:  # sliced downloads of the large file, then the rest
        transfer_manager.download_chunks_concurrently(bucket.blob(f["key"]), str(dest / f["path"]), max_workers=8,
                                                      worker_type=transfer_manager.THREAD)
    rest = [f for f in files if f not in large]
    blobs = [(bucket.blob(f["key"]), str(dest / f["path"])) for f in rest]
    results = transfer_manager.download_many(blobs, max_workers=8, worker_type=transfer_manager.THREAD)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]


def _gcs_upload(files: list[dict[str, Any]], source: Path, prefix: str, variant: str) -> None:
    from google.cloud.storage import transfer_manager

    bucket = _gcs_bucket()

    def blob(f: dict[str, Any]) -> Any:
        # "one-chunk": a resumable upload sends the whole file in one chunk (read into memory first) instead of
        # the client's default 100 MiB chunks; chunk sizes are multiples of 256 KiB
        chunk = -(-f["size"] // (256 * 1024)) * 256 * 1024 if variant.endswith("one-chunk") else None
        return bucket.blob(f"{prefix}/{f['path']}", chunk_size=chunk)

    if variant.startswith("serial"):
        for f in files:
            blob(f).upload_from_filename(str(source / f["path"]))
        return
    pairs = [(str(source / f["path"]), blob(f)) for f in files]
    results = transfer_manager.upload_many(pairs, max_workers=8, worker_type=transfer_manager.THREAD)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]


def _az_container() -> Any:
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]) \
        .get_container_client(BUCKET)


def _az_download(files: list[dict[str, Any]], dest: Path, variant: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    container = _az_container()
    per_blob = 8 if variant in ("serial-8", "threads-8") else 1

    def one(f: dict[str, Any]) -> None:
        with open(dest / f["path"], "wb") as out:
            container.get_blob_client(f["key"]).download_blob(max_concurrency=per_blob).readinto(out)

    if variant.startswith("serial"):
        for f in files:
            one(f)
        return
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, files))


def _az_upload(files: list[dict[str, Any]], source: Path, prefix: str, variant: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    container = _az_container()

    def one(f: dict[str, Any]) -> None:
        with open(source / f["path"], "rb") as data:
            container.upload_blob(f"{prefix}/{f['path']}", data, overwrite=True, max_concurrency=8)

    if variant == "serial":
        for f in files:
            one(f)
        return
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, files))


DOWNLOADS = {"s3": (_s3_download, ["default", "whole-objects"]),
             "gs": (_gcs_download, ["serial", "many", "chunks"]),
             "az": (_az_download, ["serial-8", "serial-1", "threads-8", "threads-1"])}
UPLOADS = {"s3": (_s3_upload, ["default", "16mb-parts"]),
           "gs": (_gcs_upload, ["serial", "many", "serial-one-chunk", "many-one-chunk"]),
           "az": (_az_upload, ["serial", "threads"])}


def run_baseline(argv: list[str]) -> None:
    """In the child process: ``--baseline download|upload SCHEME VARIANT SPEC.json``."""
    kind, scheme, variant, spec_path = argv
    spec = json.loads(Path(spec_path).read_text())
    files = spec["files"]
    if kind == "download":
        dest = Path(spec["dest"])
        for f in files:
            (dest / f["path"]).parent.mkdir(parents=True, exist_ok=True)
        DOWNLOADS[scheme][0](files, dest, variant)
    else:
        UPLOADS[scheme][0](files, Path(spec["source"]), spec["prefix"], variant)


# -- cloudtrain's side, also a process of its own ----------------------------------------------------------------


OUR_UPLOAD = """
import json, sys
from pathlib import Path
from cloudtrain.checkpoint import store as checkpoint_store
source, remote, spec = Path(sys.argv[1]), sys.argv[2], json.loads(Path(sys.argv[3]).read_text())
if spec["describe"]:
    checkpoint_store.describe_and_upload(source, [f["path"] for f in spec["files"]], remote)
else:
    checkpoint_store.upload_files(source, spec["files"], remote)
"""


def interleaved(repeat: int, a: Any, b: Any) -> tuple[list[float], list[float]]:
    """``repeat`` runs of each, in ABBA order, so that a drift in load or emulator state hits both alike."""
    first, second = [], []
    for i in range(repeat):
        if i % 2 == 0:
            first.append(a(i))
            second.append(b(i))
        else:
            second.append(b(i))
            first.append(a(i))
    return first, second


def delete_under(uri: str) -> None:
    from cloudtrain import storage

    store = storage.store_for(uri)
    store.delete(store.list(uri))


# -- the run ------------------------------------------------------------------------------------------------------


def make_checkpoint(folder: Path, big_mb: int, small: int, small_mb: int) -> list[str]:
    """One large shard and many small ones, incompressible, as DCP lays them out (plus the per-rank extras)."""
    names = ["__0_0.distcp"] + [f"__{i + 1}_0.distcp" for i in range(small)]
    (folder / "extra").mkdir(parents=True, exist_ok=True)
    with open(folder / names[0], "wb") as f:
        for _ in range(big_mb):
            f.write(os.urandom(MB))
    for name in names[1:]:
        (folder / name).write_bytes(os.urandom(small_mb * MB))
    (folder / ".metadata").write_bytes(os.urandom(64 * 1024))
    (folder / "extra" / "rank-0.pt").write_bytes(os.urandom(16 * 1024))
    return [*names, ".metadata", "extra/rank-0.pt"]


EMULATOR_PID: list[int] = []  # the running emulator's process: its CPU seconds are read around each timed run
CPU: dict[str, list[tuple[float, float]]] = {}  # per side: (client process CPU s, emulator CPU s) of each run


def emulator_cpu() -> float:
    if not EMULATOR_PID:
        return 0.0
    try:
        fields = Path(f"/proc/{EMULATOR_PID[0]}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def timed(argv: list[str], env: dict[str, str], side: str = "") -> float:
    """Wall seconds of a whole process; with ``side``, its CPU and the emulator's meanwhile go into CPU[side]."""
    server = emulator_cpu()
    started = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty child cannot fill it and stall
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
    if status != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed ({proc.returncode}):\n{err[-3000:]}")
    if side:
        CPU.setdefault(side, []).append((usage.ru_utime + usage.ru_stime, emulator_cpu() - server))
    return seconds


def summary(label: str, times: list[float], mb: float, side: str = "") -> str:
    med = statistics.median(times)
    line = f"    {label:44s} {med:6.2f} s  ({min(times):.2f}-{max(times):.2f})  {mb / med:6.0f} MB/s"
    if CPU.get(side):  # an emulator busy the whole run on both sides is the limit, not the client
        line += (f"  cpu: client {statistics.median(c for c, _ in CPU[side]):.2f} s, emulator "
                 f"{statistics.median(e for _, e in CPU[side]):.2f} s")
    return line


def ratio_text(theirs: list[float], ours: list[float]) -> str:
    paired = statistics.median(t / o for t, o in zip(theirs, ours, strict=True))
    return f"   {statistics.median(theirs) / statistics.median(ours):5.2f}x (paired {paired:.2f}x; target >= 1.0x)"


def bench_store(scheme: str, root: str, source: Path, names: list[str], files: list[dict[str, Any]], tmp: Path,
                env: dict[str, str], repeat: int, parts: list[str]) -> dict[str, float]:
    from cloudtrain.checkpoint import store as checkpoint_store

    mb = sum(f["size"] for f in files) / 1e6
    remote = f"{root}/{checkpoint_store.step_dir(1)}"
    keyed = [{**f, "key": f"{remote.split('/', 3)[3]}/{f['path']}"} for f in files]
    py = sys.executable
    me = str(Path(__file__).resolve())
    ratios: dict[str, float] = {}

    # (a) restore
    spec = tmp / f"{scheme}-download.json"
    dest = tmp / f"{scheme}-baseline-dest"
    spec.write_text(json.dumps({"files": keyed, "dest": str(dest)}))
    ours_dir = tmp / f"{scheme}-restore"

    def baseline_download(variant: str) -> float:
        shutil.rmtree(dest, ignore_errors=True)
        return timed([py, me, "--baseline", "download", scheme, variant, str(spec)], env, f"{scheme}-restore-sdk")

    def our_restore() -> float:
        shutil.rmtree(ours_dir, ignore_errors=True)
        return timed([py, "-m", "cloudtrain.checkpoint", "restore", root, str(ours_dir)], env,
                     f"{scheme}-restore")

    if "restore" not in parts:
        return bench_upload(scheme, root, source, files, spec, env, repeat, ratios)
    variants = {v: baseline_download(v) for v in DOWNLOADS[scheme][1]}
    best = min(variants, key=lambda v: variants[v])
    CPU.pop(f"{scheme}-restore-sdk", None)  # the figures of the best configuration's interleaved runs only
    theirs, ours = interleaved(repeat, lambda _i: baseline_download(best), lambda _i: our_restore())
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(ours_dir, ignore_errors=True)
    ratios["restore"] = statistics.median(theirs) / statistics.median(ours)
    print(f"  (a) restore of {mb:.0f} MB in {len(files)} files; SDK configurations tried once: "
          + ", ".join(f"{v} {s:.2f}s" for v, s in variants.items()))
    print(summary(f"SDK best ({best})", theirs, mb, f"{scheme}-restore-sdk"))
    print(summary("cloudtrain restore (incl. sha256 verify)", ours, mb, f"{scheme}-restore") + ratio_text(theirs, ours))
    if "upload" not in parts:
        return ratios
    return bench_upload(scheme, root, source, files, spec, env, repeat, ratios)


def bench_upload(scheme: str, root: str, source: Path, files: list[dict[str, Any]], spec: Path, env: dict[str, str],
                 repeat: int, ratios: dict[str, float]) -> dict[str, float]:
    """(b) upload: the SDK's best against cloudtrain's ``upload_files``, interleaved."""
    mb = sum(f["size"] for f in files) / 1e6
    py = sys.executable
    me = str(Path(__file__).resolve())

    def baseline_upload(variant: str, i: int) -> float:
        prefix = f"baseline-up/{variant}/{i}"
        spec.write_text(json.dumps({"files": files, "source": str(source), "prefix": prefix}))
        try:
            return timed([py, me, "--baseline", "upload", scheme, variant, str(spec)], env, f"{scheme}-upload-sdk")
        finally:
            delete_under(f"{scheme}://{BUCKET}/{prefix}")

    def our_upload(i: int, describe: bool = False) -> float:
        remote = f"{root}/ours-up/{i}"
        spec.write_text(json.dumps({"files": files, "describe": describe}))
        try:
            side = f"{scheme}-upload" + ("-described" if describe else "")
            return timed([py, "-c", OUR_UPLOAD, str(source), remote, str(spec)], env, side)
        finally:
            delete_under(remote)

    variants = {v: baseline_upload(v, -1) for v in UPLOADS[scheme][1]}
    best = min(variants, key=lambda v: variants[v])
    CPU.pop(f"{scheme}-upload-sdk", None)
    theirs, ours = interleaved(repeat, lambda i: baseline_upload(best, i), our_upload)
    ratios["upload"] = statistics.median(theirs) / statistics.median(ours)
    described = statistics.median(our_upload(100 + i, describe=True) for i in range(max(1, repeat // 2)))
    print("  (b) upload; SDK configurations tried once: " + ", ".join(f"{v} {s:.2f}s" for v, s in variants.items()))
    print(summary(f"SDK best ({best})", theirs, mb, f"{scheme}-upload-sdk"))
    print(summary("cloudtrain upload_files", ours, mb, f"{scheme}-upload") + ratio_text(theirs, ours))
    print(summary("cloudtrain describe_and_upload (+ sha256)", [described], mb))
    return ratios


@contextlib.contextmanager
def emulated(scheme: str, tmp: Path) -> Iterator[None]:
    """``scheme``'s emulator started (as tests/emulators.py starts it, on 127.0.0.1) with the bucket made and this
    process's clients pointed at it; stopped and forgotten afterwards. Its pid is what ``emulator_cpu`` reads."""
    from cloudtrain import storage
    from tests.emulators import STARTERS, create_bucket

    emulator = STARTERS[scheme](tmp)
    EMULATOR_PID[:] = [emulator.proc.pid]
    try:
        os.environ.update(emulator.env)
        storage._store.cache_clear()
        create_bucket(scheme)
        yield
    finally:
        emulator.stop()
        for var in emulator.env:
            os.environ.pop(var, None)


def main() -> None:
    if sys.argv[1:2] == ["--baseline"]:
        run_baseline(sys.argv[2:])
        return
    p = argparse.ArgumentParser()
    p.add_argument("--stores", default="s3,gs,az")
    p.add_argument("--parts", default="restore,upload")
    p.add_argument("--big-mb", type=int, default=320)
    p.add_argument("--small", type=int, default=96)
    p.add_argument("--small-mb", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("AZURITE_BIN", str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"))
    from cloudtrain import storage
    from cloudtrain.checkpoint import store as checkpoint_store

    tmp = Path(tempfile.mkdtemp(prefix="ct-transfer-"))
    source = tmp / "checkpoint"
    names = make_checkpoint(source, args.big_mb, args.small, args.small_mb)
    files = checkpoint_store.describe_files(source, names)
    load = os.getloadavg()
    print(f"checkpoint: {sum(f['size'] for f in files) / 1e6:.0f} MB in {len(files)} files; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    results: dict[str, dict[str, float]] = {}
    try:
        for scheme in args.stores.split(","):
            with emulated(scheme, tmp):
                root = f"{scheme}://{BUCKET}/bench"
                remote = storage.join(root, checkpoint_store.step_dir(1))
                checkpoint_store.upload_files(source, files, remote)
                checkpoint_store.publish(remote, 1, files, world_size=1)
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                   os.environ.get("PYTHONPATH")]))}
                print(f"{scheme}:")
                results[scheme] = bench_store(scheme, root, source, names, files, tmp, env, args.repeat,
                                               args.parts.split(","))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(ratios_line(results))


def ratios_line(results: dict[str, dict[str, float]]) -> str:
    """The run's last line: each store's ratios, SDK best / cloudtrain."""
    return "ratios (SDK best / cloudtrain, throughput): " + "; ".join(
        f"{s} " + " ".join(f"{k} {v:.2f}x" for k, v in r.items()) for s, r in results.items())


if __name__ == "__main__":
    main()
