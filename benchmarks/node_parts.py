"""Node 0 taking the other nodes' files of a save into a checkpoint: copied by the store itself (``storage.copier``)
against downloaded by node 0 and uploaded again (what every store did before, and a store plugin without ``copy()``
still does), in the same run.

    python benchmarks/node_parts.py [--stores file,s3,gs,az] [--nodes 4] [--mb-per-node 64] [--repeat 3]

A DCP save of ``--nodes`` nodes: each node holds its ranks' shard (``--mb-per-node``, incompressible), node 0 the
``.metadata`` too. Per round, nodes 1.. upload their parts with ``PartSync`` as they do on a job, then node 0
(``NodeParts`` + ``Snapshotter``) publishes the save; only node 0's publish is timed (its own shard's upload is the
same on both sides). Rounds alternate (ABBA) in fresh prefixes of each emulator (moto's S3 server,
gcp-storage-emulator, Azurite, started as tests/emulators.py starts them, on 127.0.0.1; file:// on this disk). Prints
each side's median and spread, MB/s of the other nodes' bytes, and download+upload / copy (target > 1x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.transfer import BUCKET, MB, delete_under, emulated, interleaved  # noqa: E402


def make_nodes(tmp: Path, nodes: int, mb: int) -> None:
    """Each node's files of one save, held aside (``held/node<n>/step-4``): its shard, and on node 0 the .metadata
    DCP writes last."""
    for node in range(nodes):
        folder = tmp / "held" / f"node{node}" / "step-4"
        folder.mkdir(parents=True)
        (tmp / f"node{node}").mkdir()
        with open(folder / f"__{node}_0.distcp", "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(MB))
    (tmp / "held" / "node0" / "step-4" / ".metadata").write_bytes(os.urandom(64 * 1024))


def publish_once(tmp: Path, prefix: str, nodes: int, copy: bool) -> float:
    """Nodes 1.. upload their parts; node 0 publishes the save. Returns node 0's publish time in seconds."""
    from cloudtrain import storage
    from cloudtrain.checkpoint import snapshots
    from cloudtrain.checkpoint.parts import NodeParts, PartSync

    quiet = {"quiet": 0.0, "log": lambda _m: None}
    others = [PartSync(tmp / f"node{node}", prefix, node=node, thread=False, **quiet) for node in range(1, nodes)]
    staging = tmp / ".node0.parts"
    node0 = snapshots.Snapshotter(tmp / "node0", prefix, keep=2, world_size=nodes,
                                  parts=NodeParts(prefix, nodes, staging, final_wait=2.0, log=quiet["log"]), **quiet)
    for node in range(nodes):  # written once the nodes run: what is there at their start reads as restored
        os.rename(tmp / "held" / f"node{node}" / "step-4", tmp / f"node{node}" / "step-4")
    copier = storage.copier
    try:
        for other in others:
            other.poll()
        if not copy:  # as with a store plugin that has no copy(): node 0 downloads each part, then uploads it
            storage.copier = lambda _uri: None  # type: ignore[assignment]
        started = time.perf_counter()
        step = node0.poll()
        seconds = time.perf_counter() - started
    finally:
        storage.copier = copier
        shutil.rmtree(staging, ignore_errors=True)
        for node in range(nodes):
            os.rename(tmp / f"node{node}" / "step-4", tmp / "held" / f"node{node}" / "step-4")
    if step != 4:
        raise SystemExit(f"node 0 published {step} under {prefix}, not the save of step 4")
    delete_under(prefix)  # an emulator slows down as it fills up
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", default="file,s3,gs,az")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--mb-per-node", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("AZURITE_BIN", str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"))
    tmp = Path(tempfile.mkdtemp(prefix="ct-node-parts-"))
    theirs = (args.nodes - 1) * args.mb_per_node * MB / 1e6
    print(f"a save of {args.nodes} nodes x {args.mb_per_node} MB: node 0 takes {theirs:.0f} MB of the other nodes' "
          f"files into each checkpoint; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    ratios = []
    try:
        make_nodes(tmp, args.nodes, args.mb_per_node)
        for scheme in args.stores.split(","):
            root = (tmp / "store").as_uri() if scheme == "file" else f"{scheme}://{BUCKET}/parts-bench"

            def copy_round(i: int, root: str = root) -> float:
                return publish_once(tmp, f"{root}/copy-{i}", args.nodes, copy=True)

            def download_round(i: int, root: str = root) -> float:
                return publish_once(tmp, f"{root}/download-{i}", args.nodes, copy=False)

            if scheme == "file":
                copied, fetched = interleaved(args.repeat, copy_round, download_round)
            else:
                with emulated(scheme, tmp):
                    copied, fetched = interleaved(args.repeat, copy_round, download_round)
            ratio = statistics.median(fetched) / statistics.median(copied)
            ratios.append(f"{scheme} {ratio:.2f}x")
            print(f"{scheme}:")
            for label, times in (("copied in the store (now)", copied), ("downloaded, uploaded again", fetched)):
                med = statistics.median(times)
                print(f"    {label:28s} {med:6.2f} s ({min(times):.2f}-{max(times):.2f})  {theirs / med:7.0f} MB/s")
            print(f"    download+upload / copy     {ratio:6.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ratios (node 0's publish, download+upload / copy): " + "; ".join(ratios))


if __name__ == "__main__":
    main()
