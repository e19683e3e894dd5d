"""Bundling speed and content-addressed staging.

    python benchmarks/bundle.py [--files 10000] [--mb 100]

(a) cloudtrain's deterministic bundle of a FILES-file, MB-megabyte tree vs `tar czf` of the same tree, in the same
    run (ratio = cloudtrain / tar; target <= 1.0); cloudtrain's time includes scanning every text file for
    credentials (cloudtrain/bundle/secret_scan.py), which tar does not do;
(b) bytes uploaded by staging the same tree twice (target: 0 the second time).
Data is half random (incompressible) and half text, like a source tree with a few binary assets.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

from cloudtrain import storage
from cloudtrain.bundle.packaging import PackageLimits, build_package
from cloudtrain.bundle.staging import stage_bundle


def make_tree(root: Path, files: int, total_mb: int) -> None:
    rng = random.Random(0)
    size = total_mb * 1024 * 1024 // files
    text = (b"def f(x):\n    return x * 2  # some source\n" * (size // 40 + 1))[:size]
    for i in range(files):
        d = root / f"pkg{i % 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(size) if i % 2 else text
        (d / f"mod{i}.py").write_bytes(data)


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tree"
        make_tree(root, args.files, args.mb)
        limits = PackageLimits(max_bytes=10 * 1024**3)
        tar_out = Path(tmp) / "ref.tar.gz"
        ours, theirs = [], []
        for _ in range(args.repeat):  # interleaved, so both see the same page cache and machine load
            theirs.append(timed(lambda: subprocess.run(["tar", "czf", str(tar_out), "-C", str(root), "."],
                                                       check=True)))
            ours.append(timed(lambda: build_package(root, limits).close()))
        best_ours, best_tar = min(ours), min(theirs)
        print(f"tree: {args.files} files, {args.mb} MB")
        print(f"cloudtrain bundle  {best_ours:6.2f} s")
        print(f"tar czf            {best_tar:6.2f} s   ({tar_out.stat().st_size / 1e6:.1f} MB)")
        print(f"ratio              {best_ours / best_tar:6.2f}x  (target <= 1.0)")

        store = (Path(tmp) / "store").as_uri()
        uploaded = []
        for _ in range(2):
            with build_package(root, limits) as package:
                prefix = storage.join(store, "bundles", package.digest.split(":", 1)[1])
                uploaded.append(package.bundle_bytes if stage_bundle(package, prefix) else 0)
        print(f"staged bytes: first submit {uploaded[0]:,}, unchanged re-submit {uploaded[1]:,}")
        os.sync()


if __name__ == "__main__":
    main()
