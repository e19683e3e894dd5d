"""Publishing and restoring a snapshot of a script's own checkpoint folder (issue 27), against each storage SDK's own
best transfer of the same bytes, in the same run.

    python benchmarks/snapshot.py [--stores s3,gs,az] [--mb 1024] [--repeat 3]

A nanoGPT-style checkpoint: ONE ``torch.save`` file of ``--mb`` MiB (``out/ckpt.pt``). Per store (moto's S3 server,
gcp-storage-emulator, Azurite, on 127.0.0.1), interleaved (ABBA) so both sides see the same emulator state and load:

(a) publish: a whole process that does what node 0's sync does once the save is over (``Snapshotter.poll``: scan
    the folder, read the zip's central directory, upload while hashing, re-check the file did not change, write
    the manifest, retention) vs a whole process uploading the same file with the SDK's best configuration
    (benchmarks/transfer.py's baselines). Target >= 1.0x (throughput, baseline / cloudtrain).
(b) restore: ``python -m cloudtrain.checkpoint restore URI DIR`` (list, manifest, download, verify sha256,
    put the file back under its own name) vs the SDK's best download of the object. Target >= 1.0x.
(c) blocked: what training waits for. The worker's ``torch.save`` is the script's own call, untouched; publishing
    runs in the node's bootstrap, after the file is complete. Measured here as the time a training loop in this
    process (a matmul per step) loses while a publish runs in a thread beside it (the bootstrap is another
    process on a real node: this is an upper bound), and the latency from the save's end to the snapshot being
    published by a real sync thread (``PlainSync`` looks every second).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import transfer  # noqa: E402  (benchmarks/transfer.py: its baselines, emulators and timing)

PUBLISH = """
import sys
from pathlib import Path
from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
snap = checkpoint_snapshots.Snapshotter(Path(sys.argv[1]) / "empty", sys.argv[2], keep=2, quiet=0.0,
                                        files=["ckpt.pt"])
snap.root = Path(sys.argv[1]) / "out"  # started on an empty folder, as a fresh node: the file is new to it
assert snap.poll() is not None
"""


def make_ckpt(folder: Path, mb: int) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ckpt.pt"
    torch.save({"model": torch.rand(mb * (1 << 18)), "iter_num": 1}, path)  # mb MiB of float32
    return path


def step_seconds(until: threading.Event | float) -> float:
    """Median seconds per step of a small matmul loop, run until the event is set (or for that many seconds)."""
    import torch

    a, times = torch.rand(256, 256), []
    deadline = time.perf_counter() + until if isinstance(until, float) else None
    while not (until.is_set() if isinstance(until, threading.Event) else time.perf_counter() > deadline):
        started = time.perf_counter()
        a = (a @ a).clamp_(-1, 1)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench(scheme: str, tmp: Path, mb: int, repeat: int) -> dict[str, float]:
    from cloudtrain import storage
    from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
    from cloudtrain.checkpoint import store as checkpoint_store

    folder = tmp / "out"
    path = make_ckpt(folder, mb)
    (tmp / "empty").mkdir(exist_ok=True)
    size_mb = path.stat().st_size / 1e6
    root = f"{scheme}://{transfer.BUCKET}/snap"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    py, me = sys.executable, str(REPO / "benchmarks" / "transfer.py")
    spec = tmp / f"{scheme}.json"
    files = [{"path": "ckpt.pt", "size": path.stat().st_size}]
    ratios: dict[str, float] = {}

    def sdk_upload(variant: str, i: int) -> float:
        prefix = f"baseline-up/{variant}/{i}"
        spec.write_text(json.dumps({"files": files, "source": str(folder), "prefix": prefix}))
        try:
            return transfer.timed([py, me, "--baseline", "upload", scheme, variant, str(spec)], env, f"{scheme}-up-sdk")
        finally:
            transfer.delete_under(f"{scheme}://{transfer.BUCKET}/{prefix}")

    def our_publish(i: int) -> float:
        uri = f"{root}/publish-{i}"
        try:
            return transfer.timed([py, "-c", PUBLISH, str(tmp), uri], env, f"{scheme}-publish")
        finally:
            transfer.delete_under(uri)

    variants = {v: sdk_upload(v, -1) for v in transfer.UPLOADS[scheme][1]}
    best = min(variants, key=lambda v: variants[v])
    transfer.CPU.pop(f"{scheme}-up-sdk", None)
    theirs, ours = transfer.interleaved(repeat, lambda i: sdk_upload(best, i), our_publish)
    ratios["publish"] = statistics.median(theirs) / statistics.median(ours)
    print(f"  (a) publish of one {size_mb:.0f} MB torch.save file; SDK configurations tried once: "
          + ", ".join(f"{v} {s:.2f}s" for v, s in variants.items()))
    print(transfer.summary(f"SDK best upload ({best})", theirs, size_mb, f"{scheme}-up-sdk"))
    print(transfer.summary("cloudtrain snapshot publish (+ sha256, manifest)", ours, size_mb, f"{scheme}-publish")
          + transfer.ratio_text(theirs, ours))

    # (b) restore of a published snapshot into a fresh folder, under its own name
    uri = f"{root}/restore"
    snap = checkpoint_snapshots.Snapshotter(tmp / "empty", uri, keep=2, quiet=0.0, files=["ckpt.pt"])
    snap.root = folder
    assert snap.poll() is not None
    newest = checkpoint_store.list_complete(uri)[-1]
    keyed = [{"path": "ckpt.pt", "size": files[0]["size"], "key": f"{newest.uri.split('/', 3)[3]}/ckpt.pt"}]
    dest, mine = tmp / "sdk-dest", tmp / "restored"
    spec.write_text(json.dumps({"files": keyed, "dest": str(dest)}))

    def sdk_download(variant: str) -> float:
        shutil.rmtree(dest, ignore_errors=True)
        return transfer.timed([py, me, "--baseline", "download", scheme, variant, str(spec)], env,
                              f"{scheme}-down-sdk")

    def our_restore() -> float:
        shutil.rmtree(mine, ignore_errors=True)
        return transfer.timed([py, "-m", "cloudtrain.checkpoint", "restore", uri, str(mine)], env,
                              f"{scheme}-restore")

    downloads = {v: sdk_download(v) for v in transfer.DOWNLOADS[scheme][1]}
    fastest = min(downloads, key=lambda v: downloads[v])
    transfer.CPU.pop(f"{scheme}-down-sdk", None)
    theirs, ours = transfer.interleaved(repeat, lambda _i: sdk_download(fastest), lambda _i: our_restore())
    assert (mine / "ckpt.pt").stat().st_size == files[0]["size"] and sorted(os.listdir(mine)) == ["ckpt.pt"]
    ratios["restore"] = statistics.median(theirs) / statistics.median(ours)
    print("  (b) restore into the checkpoint folder; SDK configurations tried once: "
          + ", ".join(f"{v} {s:.2f}s" for v, s in downloads.items()))
    print(transfer.summary(f"SDK best download ({fastest})", theirs, size_mb, f"{scheme}-down-sdk"))
    print(transfer.summary("cloudtrain restore (+ sha256 verify)", ours, size_mb, f"{scheme}-restore")
          + transfer.ratio_text(theirs, ours))
    storage.store_for(uri).delete(storage.store_for(uri).list(uri))
    return ratios


def blocked(tmp: Path, mb: int) -> None:
    """(c) on the file store: a training loop beside a publish, and save end -> published by a real sync thread."""
    from cloudtrain import contract
    from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
    from cloudtrain.checkpoint import sync as checkpoint_sync

    folder, store = tmp / "blocked" / "out", tmp / "blocked" / "store"
    snap = checkpoint_snapshots.Snapshotter(folder, store.as_uri() + "/beside", keep=2, quiet=0.0, files=["ckpt.pt"])
    started = time.perf_counter()
    make_ckpt(folder, mb)
    saved = time.perf_counter() - started
    alone = step_seconds(2.0)
    over = threading.Event()
    publisher = threading.Thread(target=lambda: (snap.poll(), over.set()))
    publisher.start()
    beside = step_seconds(over)
    publisher.join()
    shutil.rmtree(folder)
    env = {contract.CHECKPOINT_DIR: str(folder), contract.CHECKPOINT_URI: store.as_uri() + "/sync",
           contract.CHECKPOINT_INTERVAL: "60", contract.CHECKPOINT_FILES: "ckpt.pt"}
    sync = checkpoint_sync.PlainSync(env, tmp)
    make_ckpt(folder, mb)
    done = time.perf_counter()
    while not list((store / "sync").rglob("manifest.json")):
        time.sleep(0.01)
    published = time.perf_counter() - done
    sync.finish()
    print(f"  (c) torch.save of {mb} MiB: {saved:.2f} s, the script's own call (nothing of cloudtrain runs in the "
          f"worker); save end -> snapshot published by the sync thread: {published:.2f} s")
    print(f"      a training step alone {alone * 1e3:.2f} ms; beside a publish in the same process "
          f"{beside * 1e3:.2f} ms ({beside / alone:.2f}x; on a node the publish runs in the bootstrap's process)")


def last_byte_to_publish(tmp: Path, declared: bool, saves: int, every: float,
                         pause: float) -> list[tuple[int, float]]:
    """(d) A script saving model.pt, then (``pause`` s later) optim.pt, every ``every`` s, overwritten in place, under a
    real sync thread (``PlainSync``, a look a second): for each checkpoint published, the seconds from the last byte of
    the save it holds (its files' newest mtime) to its manifest (its ``created``). Without checkpoint.files the first
    save is published once the next one has shown it was whole (or never, if its window is missed); with them, each
    the moment its files are whole."""
    import torch

    from cloudtrain import contract
    from cloudtrain.checkpoint import store as checkpoint_store
    from cloudtrain.checkpoint import sync as checkpoint_sync

    side = tmp / ("declared" if declared else "learned")
    folder, uri = side / "ckpt", (side / "store").as_uri()
    folder.mkdir(parents=True)
    env = {contract.CHECKPOINT_DIR: str(folder), contract.CHECKPOINT_URI: uri, contract.CHECKPOINT_KEEP: "1000",
           contract.CHECKPOINT_LAYOUT: contract.SCRIPT_LAYOUT, contract.CHECKPOINT_INTERVAL: "60",
           **({contract.CHECKPOINT_FILES: "model.pt\noptim.pt"} if declared else {})}
    sync = checkpoint_sync.PlainSync(env, side, log=lambda _m: None)
    last_bytes: dict[int, float] = {}
    for step in range(1, saves + 1):
        torch.save({"step": step, "w": torch.rand(1 << 18)}, folder / "model.pt")
        time.sleep(pause)
        torch.save({"step": step, "w": torch.rand(1 << 18)}, folder / "optim.pt")
        last_bytes[step] = (folder / "optim.pt").stat().st_mtime
        time.sleep(every - pause)
    sync.finish()
    took = []
    for found in checkpoint_store.list_complete(uri, log=lambda _m: None):
        step = torch.load(Path(found.uri.removeprefix("file://")) / "optim.pt")["step"]
        took.append((step, found.manifest["created"] - last_bytes[step]))
    return took


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stores", default="s3,gs,az")
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("AZURITE_BIN", str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"))
    tmp = Path(tempfile.mkdtemp(prefix="ct-snapshot-"))
    load = os.getloadavg()
    print(f"one {args.mb} MiB torch.save file; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on "
          f"{os.cpu_count()} cores")
    results: dict[str, dict[str, float]] = {}
    try:
        saves, every, pause = 8, 3.0, 1.0
        sides = {declared: last_byte_to_publish(tmp, declared, saves, every, pause) for declared in (True, False)}
        print(f"  (d) a save of model.pt then optim.pt {pause:g} s later, every {every:g} s, {saves} saves, "
              "overwritten in place: from a save's last byte to its publish")
        for declared, took in sides.items():
            name = "checkpoint.files declared" if declared else "set learned (no checkpoint.files)"
            seconds = [t for _, t in took]
            print(f"      {name}: none published" if not took else
                  f"      {name}: {len(took)} of {saves} saves published, the first being save {took[0][0]} "
                  f"({took[0][1]:.2f} s after its last byte, {took[0][1] + (took[0][0] - 1) * every:.2f} s after the "
                  f"first save's); median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s")
        blocked(tmp, args.mb)
        for scheme in args.stores.split(","):
            with transfer.emulated(scheme, tmp):
                print(f"{scheme}:")
                results[scheme] = bench(scheme, tmp / scheme, args.mb, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(transfer.ratios_line(results))


if __name__ == "__main__":
    main()
