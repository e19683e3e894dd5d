"""The checkpoint component's command line, ``python -m cloudtrain.checkpoint restore|sync``: a node's restore and
plain-script sync as processes of their own, for scripts, benchmarks and debugging a store by hand."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cloudtrain import contract
from cloudtrain.checkpoint.download import log_line
from cloudtrain.checkpoint.restore import restore_report
from cloudtrain.checkpoint.store import RUNTIME_MARKER, runtime_unpublished
from cloudtrain.checkpoint.sync import sync_dir
from cloudtrain.errors import CloudtrainError


def _report(result: dict[str, Any], code: int) -> int:
    """One JSON line on stdout, read by the bootstrap (which logs ``error`` and puts it in the node's status)."""
    print(json.dumps(result), flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """What the bootstrap runs around torchrun (each prints one JSON line; ``error`` and exit 1 on failure):

    ``python -m cloudtrain.checkpoint restore URI DIR``           before the workers start
    ``python -m cloudtrain.checkpoint sync DIR URI [--every S]``   while they run (node 0)
    ``python -m cloudtrain.checkpoint sync DIR URI --final``       after they exited (node 0)

    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "restore":
        report = restore_report(args[1], Path(args[2]))
        return _report(report, 1) if report["error"] else _report({"step": report["step"]}, 0)
    if len(args) >= 3 and args[0] == "sync":
        local, uri, rest = Path(args[1]), args[2], args[3:]
        keep = contract.keep_count(os.environ.get(contract.CHECKPOINT_KEEP))
        if "--final" in rest:
            try:
                published = sync_dir(local, uri, final=True, keep=keep)
            except CloudtrainError as exc:
                return _report({"published": [], "error": str(exc)}, 1)
            unpublished = runtime_unpublished(local) if (local / RUNTIME_MARKER).exists() else None
            return _report({"published": published, "error": unpublished}, 1 if unpublished else 0)
        every = float(rest[rest.index("--every") + 1]) if "--every" in rest else contract.SYNC_EVERY
        while True:
            try:
                sync_dir(local, uri, final=False, keep=keep)
            except CloudtrainError as exc:  # the final sync tries again and decides the job's outcome
                log_line(f"warning: {exc}; trying again in {every:.0f}s")
            time.sleep(every)
    print("usage: python -m cloudtrain.checkpoint restore URI DIR | sync DIR URI [--every S | --final]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
