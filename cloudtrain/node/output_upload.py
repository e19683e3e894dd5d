"""A node's logs and outputs, copied to the job's output location when the node ends (what `cloudtrain outputs`
lists and downloads: cloudtrain/jobs/outputs.py). Standard library only, Python 3.8, but for the storage client a URI
needs.

    python -m cloudtrain.node.output_upload upload-logs DIR URI  # a node's worker logs, at its end
    python -m cloudtrain.node.output_upload upload DIR URI       # a node's output folder (CLOUDTRAIN_OUTPUT_DIR)
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable

from cloudtrain import storage
from cloudtrain.errors import CloudtrainError


def upload_tree(folder: Path, uri: str, name: Callable[[str], str] = str) -> int:
    """Copy every file under ``folder`` to ``uri`` under ``name(relative path)``; returns the number of files."""
    count = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        target = storage.join(uri, name(path.relative_to(folder).as_posix()))
        storage.with_retries(functools.partial(storage.put_file, path, target), f"upload of {target}")
        count += 1
    return count


def log_name(relative: str, runs: int) -> str:
    """torchrun's ``<run id>_<random>/attempt_N/<local rank>/stdout.log`` as ``attempt_N/local-rank-R/stdout.log``:
    the run folder says nothing to a reader when the node ran torchrun once (``runs``), so it goes."""
    parts = relative.split("/")
    if len(parts) == 4 and parts[1].startswith("attempt_") and parts[2].isdigit():
        parts[2] = f"local-rank-{parts[2]}"
        if runs == 1:
            parts = parts[1:]
    return "/".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] not in ("upload-logs", "upload"):
        print("usage: python -m cloudtrain.node.output_upload upload-logs|upload DIR URI", file=sys.stderr)
        return 2
    if args[0] == "upload":
        return upload_outputs(Path(args[1]), args[2])
    folder, uri = Path(args[1]), args[2]
    if not folder.is_dir():
        count = 0
    else:
        runs = sum(1 for p in folder.iterdir() if p.is_dir())
        try:
            count = upload_tree(folder, uri, functools.partial(log_name, runs=runs))
        except CloudtrainError as exc:  # one line, no traceback: the bootstrap says where the logs still are
            print(f"[cloudtrain] error: {exc.message}", flush=True)
            return 1
    print(f"[cloudtrain] logs: {count} file(s) copied to {uri}", flush=True)
    return 0


def upload_outputs(folder: Path, uri: str) -> int:
    """What a plain script left in its output folder, copied to the job's output location (folders kept)."""
    count = upload_tree(folder, uri) if folder.is_dir() else 0
    print(f"[cloudtrain] outputs: {count} file(s) copied to {uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
