"""One node's restore of a sharded (FSDP) Checkpointer checkpoint on a job of several nodes: the whole checkpoint
(what every node did before) against the small files plus the shards its ranks read (``on_demand.py``), in the
same run.

    python benchmarks/node_restore.py [--stores file,s3,gs,az] [--nodes 4] [--ranks-per-node 2] [--mb-per-rank 32]
                                      [--repeat 3]

The checkpoint: ``--nodes`` x ``--ranks-per-node`` ranks, each with one shard of ``--mb-per-rank`` (incompressible),
rank 0's holding the small items every rank reads (as ``dcp_files.SavePlanner`` writes them), the ``.metadata`` and
each rank's extra state, published as the Checkpointer publishes. The timed node is the last one: "whole" is the
node's restore of everything (``nodes=1``); "on demand" is its restore of the small files (``nodes=N``) and then
its ranks' fetch of their own shards and rank 0's, each rank in a thread of its own (the locks shared as a node's
processes share them). Rounds alternate (ABBA) in fresh folders and prefixes of each emulator (moto's S3 server,
gcp-storage-emulator, Azurite, on 127.0.0.1; file:// on this disk). Prints each side's median and spread, the
bytes each moved, and whole / on demand (target > 1x; the bytes' ratio is what a network link gains).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.transfer import BUCKET, MB, delete_under, emulated, interleaved  # noqa: E402

STEP = 4


def make_checkpoint(tmp: Path, ranks: int, mb: int) -> Path:
    folder = tmp / "written"
    (folder / "extra").mkdir(parents=True)
    for rank in range(ranks):
        with open(folder / f"__{rank}_0.distcp", "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(MB))
        (folder / "extra" / f"rank-{rank}.pt").write_bytes(os.urandom(4096))
    (folder / ".metadata").write_bytes(os.urandom(64 * 1024))
    return folder


def publish(folder: Path, prefix: str) -> None:
    from cloudtrain import storage
    from cloudtrain.checkpoint import store as checkpoint_store

    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    remote = storage.join(prefix, checkpoint_store.step_dir(STEP))
    files = checkpoint_store.describe_and_upload(folder, names, remote, log=lambda _m: None)
    checkpoint_store.publish(remote, STEP, files, world_size=len([n for n in names if n.endswith(".distcp")]))


def restore_once(tmp: Path, prefix: str, nodes: int, per_node: int, on_demand: bool) -> tuple[float, int]:
    """The last node's restore; returns (seconds, bytes moved)."""
    from cloudtrain.checkpoint import on_demand as fetching
    from cloudtrain.checkpoint import restore as checkpoint_restore
    from cloudtrain.checkpoint import store as checkpoint_store

    local = tmp / "node"
    moved: list = []
    started = time.perf_counter()
    checkpoint_restore.restore_latest(prefix, local, log=lambda _m: None, moved=moved,
                                      nodes=nodes if on_demand else 1)
    fetched = 0
    if on_demand:
        folder = local / checkpoint_store.step_dir(STEP)
        first = (nodes - 1) * per_node

        def rank(r: int) -> int:
            source = fetching.OnDemand(prefix, STEP, folder, log=lambda _m: None)
            source.fetch(sorted({"__0_0.distcp", f"__{r}_0.distcp"}))
            return source.fetched.bytes

        with ThreadPoolExecutor(per_node) as pool:
            fetched = sum(pool.map(rank, range(first, first + per_node)))
    seconds = time.perf_counter() - started
    shutil.rmtree(local, ignore_errors=True)
    return seconds, moved[0].bytes + fetched


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", default="file,s3,gs,az")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--mb-per-rank", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("AZURITE_BIN", str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"))
    tmp = Path(tempfile.mkdtemp(prefix="ct-node-restore-"))
    ranks = args.nodes * args.ranks_per_node
    print(f"a checkpoint of {args.nodes} nodes x {args.ranks_per_node} ranks x {args.mb_per_rank} MB: the last node "
          f"restores it; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    ratios = []
    try:
        written = make_checkpoint(tmp, ranks, args.mb_per_rank)
        for scheme in args.stores.split(","):
            root = (tmp / "store").as_uri() if scheme == "file" else f"{scheme}://{BUCKET}/restore-bench"
            moved_by: dict[tuple[bool, int], int] = {}  # (on demand, round) -> bytes moved

            def one(i: int, on_demand: bool, root: str = root, moved_by: dict = moved_by) -> float:
                prefix = f"{root}/{'demand' if on_demand else 'whole'}-{i}"
                publish(written, prefix)
                seconds, moved_by[(on_demand, i)] = restore_once(tmp, prefix, args.nodes, args.ranks_per_node,
                                                                on_demand)
                delete_under(prefix)  # an emulator slows down as it fills up
                return seconds

            def run() -> tuple[list[float], list[float]]:
                return interleaved(args.repeat, lambda i: one(i, True), lambda i: one(i, False))

            if scheme == "file":
                demand, whole = run()
            else:
                with emulated(scheme, tmp):
                    demand, whole = run()
            moved = {flag: statistics.median(b for (f, _i), b in moved_by.items() if f == flag) / 1e6
                     for flag in (True, False)}
            ratio = statistics.median(whole) / statistics.median(demand)
            ratios.append(f"{scheme} {ratio:.2f}x ({moved[False] / moved[True]:.2f}x fewer bytes)")
            print(f"{scheme}:")
            for label, times, flag in (("on demand (now)", demand, True), ("whole checkpoint", whole, False)):
                med = statistics.median(times)
                print(f"    {label:18s} {med:6.2f} s ({min(times):.2f}-{max(times):.2f})  {moved[flag]:7.0f} MB")
            print(f"    whole / on demand  {ratio:6.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ratios (the last node's restore, whole / on demand): " + "; ".join(ratios))


if __name__ == "__main__":
    main()
