#!/usr/bin/env python3
"""cloudtrain's in-node bootstrap, its first stage: the first thing every node of every job runs, locally and in the
cloud. It fetches the bundle (a local path: providers mount or download it first), verifies its digest, unpacks it
safely, and hands over to the node entry the bundle carries (cloudtrain/node/entry.py, from the bundle's lib/), which
runs the node: secrets masked, the node's place derived with the platform's node contract, requirements, torchrun,
signals, checkpoints, the outcome.

It must run on any image cloudtrain can choose (Python 3.8 and newer), before anything is installed: one file, the
standard library only, nothing newer than Python 3.8 has (tests/test_bootstrap.py runs under 3.8 in CI). It holds
only what must happen before the bundle is unpacked; everything else is the bundle's, so it is the same code as the
planner's (cloudtrain/node/launch.py derives the torchrun lines for both).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tarfile
import time
import zlib
from pathlib import Path

# What this stage must know before the bundle (and cloudtrain/contract.py in it) is unpacked:
# - the exit code of a node that cannot start (contract.EXIT_USAGE, which the node entry returns for the same
#   reason after unpacking); tests/test_bundle_errors.py runs a bad bundle and checks the code against the contract;
# - the unpacking limits, which only this stage applies: no member (and no bundle) may fill a node's disk.
# Its own few output lines name the bundle's local path and what is wrong with it, never a secret (no environment
# value reaches them), so they are not masked: masking starts in the node entry, from the bundle.
EXIT_USAGE = 2
MAX_MEMBER_BYTES = 8 * 1024**3
MAX_TOTAL_BYTES = 32 * 1024**3


class BootstrapError(Exception):
    """A node cannot start: its bundle is missing, altered or cannot be unpacked. Printed without a traceback."""


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """This stage's own options; the whole command line (cloudtrain/node/launch.py parse_args) goes to the node
    entry, which checks the rest once the bundle is unpacked."""
    own = argv[:argv.index("--")] if "--" in argv else argv  # after "--": the script's own arguments
    p = argparse.ArgumentParser(prog="bootstrap.py", description="cloudtrain in-node bootstrap",
                                epilog="The node's other options (--script or --module, --nproc-per-node, --job-id, "
                                       "requirements, --env, --node-contract ...) are read by the node entry the "
                                       "bundle carries (cloudtrain/node/launch.py).")
    p.add_argument("--bundle", required=True, help="bundle.tar.gz path or file:// URI (or its folder)")
    p.add_argument("--digest", help="expected sha256:<hex> of the bundle")
    p.add_argument("--workdir", required=True, help="where the bundle is unpacked")
    p.add_argument("--status-file", help="write the node's outcome here as JSON")
    return p.parse_known_args(own)[0]


def fetch_bundle(bundle: str) -> Path:
    """A node only ever reads its bundle from a local path: providers mount or download it before we start."""
    path = Path(bundle[len("file://"):]) if bundle.startswith("file://") else Path(bundle)
    try:
        path = path / "bundle.tar.gz" if path.is_dir() else path
        if not path.is_file():
            raise BootstrapError(f"bundle {bundle} not found")
        open(path, "rb").close()  # readable now, rather than half-way through unpacking
    except (OSError, ValueError) as exc:  # unreadable, a name too long, a NUL byte ...
        raise BootstrapError(f"bundle {bundle} cannot be read: {exc}") from None
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _member_path(name: str, dest: Path, is_dir: bool) -> Path | None:
    """Where member ``name`` goes under ``dest`` (None: './' itself); no nameless files, no way out of ``dest``."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts and not is_dir:
        raise BootstrapError(f"bundle member {name!r} is a file without a name")
    target = dest.joinpath(*parts) if parts else None
    resolved = target.resolve() if target else dest
    inside = resolved == dest or dest in resolved.parents  # Path.is_relative_to is 3.9+; nodes may run 3.8
    if "\0" in name or name.startswith("/") or ".." in parts or not inside:
        raise BootstrapError(f"bundle member {name!r} would be written outside {dest}")
    return target


def safe_extract(archive: Path, dest: Path) -> int:
    """Extract only regular files and folders that stay inside ``dest``; refuse anything else before writing. A bundle
    that is not a readable gzip tar or cannot be written out is a BootstrapError; what was written of it is removed."""
    dest = dest.resolve()
    try:
        return _extract(archive, dest)
    except (BootstrapError, tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, BootstrapError):
            raise
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the disk, not the bundle
            raise BootstrapError(f"cannot unpack the bundle: no space left on the disk holding {dest}: free space "
                                 "there, or move the job's working folder to a disk with room") from None
        raise BootstrapError(f"bundle {archive} cannot be unpacked ({type(exc).__name__}: {exc}): truncated, "
                             "corrupt or not a gzip tar; stage it again (submit the job again)") from None


def _extract(archive: Path, dest: Path) -> int:
    total = 0
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        targets: dict[str, Path | None] = {}
        for m in members:
            if not (m.isfile() or m.isdir()):
                raise BootstrapError(f"bundle member {m.name!r} is a link or device; bundles hold plain files only")
            targets[m.name] = _member_path(m.name, dest, m.isdir())
            if m.size > MAX_MEMBER_BYTES:
                raise BootstrapError(f"bundle member {m.name!r} is {m.size} bytes, over the {MAX_MEMBER_BYTES} limit")
            total += m.size
            if total > MAX_TOTAL_BYTES:
                raise BootstrapError(f"bundle expands to more than {MAX_TOTAL_BYTES} bytes")
        dest.mkdir(parents=True, exist_ok=True)
        for m in members:
            target = targets[m.name]
            if target is not None and m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            if target is None or m.isdir():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            with src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
            os.chmod(target, 0o755 if m.mode & 0o100 else 0o644)
    return total


def unpack(args: argparse.Namespace) -> Path:
    """The bundle, fetched, verified and unpacked under the working folder: where it now is."""
    workdir = Path(args.workdir).resolve()
    bundle = fetch_bundle(args.bundle)
    if args.digest and sha256_of(bundle) != args.digest:
        raise BootstrapError(f"bundle {bundle} does not match its digest {args.digest}: altered or truncated")
    unpacked = workdir / "bundle"
    if unpacked.exists():
        shutil.rmtree(unpacked)
    safe_extract(bundle, unpacked)
    return unpacked


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = time.time()
    early_stop: list[int] = []  # a SIGTERM while unpacking or restoring still means "preempted", not "failed"
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early_stop.append(signum))
    try:
        unpacked = unpack(args)
        sys.path.insert(0, str(unpacked / "lib"))  # cloudtrain's node side, from the bundle
        try:
            from cloudtrain.node import entry
        except ImportError as exc:
            raise BootstrapError(f"bundle {args.bundle} has no node entry (cloudtrain/node/entry.py: {exc}): stage "
                                 "it again with this cloudtrain (submit the job again)") from None
    except BootstrapError as exc:
        log(f"error: {exc}")
        write_status(args.status_file, {"outcome": "failed", "returncode": EXIT_USAGE, "started": started,
                                        "error": str(exc), "ended": time.time()})
        return EXIT_USAGE
    return entry.main(argv, unpacked, early_stop, started)


def write_status(path: str | None, status: dict[str, object]) -> None:
    """The node's status file, where it cannot start (once it runs, the node entry writes it)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path + ".tmp").write_text(json.dumps(status, indent=2))
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
