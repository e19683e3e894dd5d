"""Retention of a checkpoint (the deletes after each publish) against the same deletes sent one after another.

    python benchmarks/retention.py [--stores gs,az] [--files 193] [--repeat 3] [--round-trip-ms 20]

Retention runs after every publish, in the save's background thread, and the next save waits for it (so does the
final save at a SIGTERM, inside the grace period). Per store (moto's S3 server, gcp-storage-emulator, Azurite,
started as tests/emulators.py starts them, on 127.0.0.1), a checkpoint of ``--files`` small files (the default: a
64-rank job, two shards and an extra each, and its .metadata) is published three times, and
``apply_retention(keep=2)`` removes the oldest, against the same files deleted one request after another (what
GCS's and Azure's stores did before; S3 sends one batch request either way). Interleaved (ABBA), fresh checkpoints
for each run. Prints the median of each side and the ratio (one after another / cloudtrain), first against the
emulator itself (it shares the machine's CPUs with the client, and is often the limit), then with every request
answered ``--round-trip-ms`` later (tests/faultproxy.py in front), as a cloud's round trip would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from transfer import BUCKET, emulated, interleaved  # noqa: E402


@contextlib.contextmanager
def round_trip(scheme: str, seconds: float) -> Iterator[None]:
    """Every request to the running emulator answered ``seconds`` late, through a FaultProxy in front of it."""
    if seconds <= 0:
        yield
        return
    from cloudtrain import storage
    from tests.faultproxy import FaultPlan, FaultProxy
    from tests.faulty import ENDPOINT_ENV

    name = ENDPOINT_ENV[scheme]
    before = os.environ[name]
    found = re.search(r"127\.0\.0\.1:(\d+)", before)
    assert found, before
    proxy = FaultProxy(int(found.group(1)), flavor=scheme, plan=FaultPlan(rate=0.0, delay=seconds)).start()
    os.environ[name] = before.replace(found.group(0), f"127.0.0.1:{proxy.port}")
    storage._store.cache_clear()  # the stores' clients are built from the environment
    try:
        with proxy.fail_matching(lambda _request: True, kind="slow"):
            yield
    finally:
        os.environ[name] = before
        proxy.stop()
        storage._store.cache_clear()


def publish(root: str, step: int, folder: Path, names: list[str]) -> None:
    from cloudtrain import storage
    from cloudtrain.checkpoint import store as checkpoint_store

    files = checkpoint_store.describe_files(folder, names)
    remote = storage.join(root, checkpoint_store.step_dir(step))
    checkpoint_store.upload_files(folder, files, remote)
    checkpoint_store.publish(remote, step, files, world_size=1)


def bench(scheme: str, folder: Path, names: list[str], repeat: int, label: str, tag: str) -> float:
    from cloudtrain import storage
    from cloudtrain.checkpoint import store as checkpoint_store
    from cloudtrain.checkpoint.retention import apply_retention

    def prepared(run: int, side: str) -> str:
        root = f"{scheme}://{BUCKET}/retention-{tag}-{side}-{run}"
        for step in (1, 2, 3):
            publish(root, step, folder, names)
        return root

    def ours(run: int) -> float:
        root = prepared(run, "cloudtrain")
        started = time.perf_counter()
        removed = apply_retention(root, 2, log=lambda _m: None)
        seconds = time.perf_counter() - started
        assert removed == [1], removed
        return seconds

    def one_after_another(run: int) -> float:
        root = prepared(run, "serial")
        store = storage.store_for(root)
        started = time.perf_counter()
        folder_uri = storage.join(root, checkpoint_store.step_dir(1))
        listed = store.list(folder_uri)  # retention lists the store too: the same work around the deletes
        for uri in sorted(listed, key=lambda u: not u.endswith("manifest.json")):  # the manifest first, as retention
            store.delete([uri])
        seconds = time.perf_counter() - started
        assert not store.list(folder_uri)
        return seconds

    theirs, mine = interleaved(repeat, one_after_another, ours)
    ratio = statistics.median(theirs) / statistics.median(mine)
    print(f"{scheme}, {label}: {len(names) + 1} objects per checkpoint")
    print(f"    one request after another   {statistics.median(theirs):6.3f} s  ({min(theirs):.3f}-{max(theirs):.3f})")
    print(f"    cloudtrain apply_retention  {statistics.median(mine):6.3f} s  ({min(mine):.3f}-{max(mine):.3f})"
          f"   {ratio:5.2f}x")
    return ratio


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stores", default="gs,az", help="s3 sends one batch request either way")
    p.add_argument("--files", type=int, default=193)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--round-trip-ms", type=float, default=20.0)
    args = p.parse_args()
    os.environ.setdefault("AZURITE_BIN", str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"))
    tmp = Path(tempfile.mkdtemp(prefix="ct-retention-"))
    folder = tmp / "checkpoint"
    ranks = max(1, (args.files - 1) // 3)
    names = [f"__{r}_{i}.distcp" for r in range(ranks) for i in range(2)] + \
        [f"extra/rank-{r}.pt" for r in range(ranks)] + [".metadata"]
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(4096))
    ratios = {}
    try:
        for scheme in args.stores.split(","):
            with emulated(scheme, tmp):
                ratios[f"{scheme} (emulator)"] = bench(scheme, folder, names, args.repeat, "the emulator itself",
                                                       "direct")
                with round_trip(scheme, args.round_trip_ms / 1000):
                    ratios[f"{scheme} ({args.round_trip_ms:g} ms)"] = bench(
                        scheme, folder, names, args.repeat, f"{args.round_trip_ms:g}-ms round trips", "late")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ratios (one after another / cloudtrain): " + "; ".join(f"{s} {r:.2f}x" for s, r in ratios.items()))


if __name__ == "__main__":
    main()
