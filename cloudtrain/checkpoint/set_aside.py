"""Checkpoints set aside (stdlib only, Python 3.8): a checkpoint whose files all verify, and yet one no start should
restore again.

A checkpoint can match its manifest and still be one a script cannot load: a subset of a save (``model.safetensors``
without ``optimizer.bin``), the state of a model that has changed since. Restoring it again would only crash again,
on every restart and every resubmission. So the node that restored it, whose workers then failed before any
progress, sets it aside (cloudtrain/node/unloadable.py decides when): a marker beside its manifest,
``set-aside-<manifest sha256>.json``, saying why. Every later listing skips it (store.complete_among: every restore,
the Checkpointer's own included, what `status` says a restart resumes from, a move to another store), retention
never deletes it, and `cloudtrain checkpoints` shows it with its reason. The marker names that very manifest: a
checkpoint published again under the same step is another checkpoint. ``submit --restore-from N`` lifts N's marker
(picked on purpose) and sets aside, as passed over, the newer checkpoints a restart would otherwise take
(restore_from.py).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain import contract, safe_json, storage
from cloudtrain.checkpoint.manifest import Checkpoint, set_aside_name
from cloudtrain.errors import CloudtrainError

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]

FAILED = "failed"  # a start that restored it failed before any progress
PASSED_OVER = "passed_over"  # submit --restore-from chose an older checkpoint


@dataclass(frozen=True)
class Aside:
    """A checkpoint set aside, as its marker says: why (in words), and for FAILED the failure's signature (the first
    failed rank's exception line, without what differs from node to node), which tells a failure that follows the
    script from one that follows a checkpoint (node/unloadable.py)."""

    checkpoint: Checkpoint
    kind: str
    reason: str
    signature: str = ""
    at: float | None = None
    by: str = ""

    @property
    def step(self) -> int:
        return self.checkpoint.step

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "uri": self.checkpoint.uri, "kind": self.kind, "reason": self.reason,
                "signature": self.signature, "at": self.at, "by": self.by}


def marker_uri(checkpoint: Checkpoint) -> str:
    return storage.join(checkpoint.uri, set_aside_name(checkpoint.digest))


def read(checkpoint: Checkpoint) -> Aside:
    """The marker of a checkpoint set aside (one the listing found). A marker that cannot be read or is not
    cloudtrain's still sets the checkpoint aside (someone meant it), and says so."""
    try:
        data = safe_json.loads(storage.with_retries(lambda: storage.read_bytes(marker_uri(checkpoint)),
                                                    f"reading {marker_uri(checkpoint)}", attempts=2),
                               "it")
        if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
            raise ValueError("not an object with a reason")
    except (CloudtrainError, ValueError) as exc:
        why = exc.message if isinstance(exc, safe_json.UnreadableJson) else str(exc)  # not its fix: this one's stands
        return Aside(checkpoint, FAILED, f"its marker {marker_uri(checkpoint)} is unreadable ({why})")
    at = data.get("at")
    return Aside(checkpoint, str(data.get("kind") or FAILED), data["reason"], str(data.get("signature") or ""),
                 float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
                 str(data.get("by") or ""))


def set_aside(checkpoint: Checkpoint, kind: str, reason: str, signature: str = "") -> None:
    """Write the marker (raises CloudtrainError where the store refuses it: the caller says what that means)."""
    by = f"job {os.environ.get(contract.JOB_ID) or '?'} on {socket.gethostname()}"
    body = json.dumps({"kind": kind, "reason": reason, "signature": signature, "manifest_sha256": checkpoint.digest,
                       "step": checkpoint.step, "at": time.time(), "by": by}, indent=1).encode()
    target = marker_uri(checkpoint)
    storage.with_retries(lambda: storage.write_bytes(target, body), f"setting aside {checkpoint.uri}", attempts=3)


def lift(checkpoint: Checkpoint) -> None:
    """Take the marker away: the checkpoint is usable again (raises CloudtrainError where the store refuses)."""
    target = marker_uri(checkpoint)
    storage.with_retries(lambda: storage.store_for(target).delete([target]), f"lifting the marker {target}",
                         attempts=3)


def newest_note(survey: Any) -> str | None:
    """``checkpoint 2 is set aside (why)`` for the checkpoints set aside that are newer than every usable one (a
    restart passes over them), from a store.Survey; None where there are none."""
    newest = survey.complete[-1].step if survey.complete else -1
    passed = [c for c in survey.set_aside if c.step > newest]
    if not passed:
        return None
    more = f" (and {len(passed) - 1} more)" if len(passed) > 1 else ""
    aside = read(passed[-1])
    return f"checkpoint {aside.step} is set aside ({aside.reason}){more}"
