"""What ended runs measured, for ``checkpoint.interval: auto`` (cloudtrain/plan/checkpoint_interval.py): each run's
checkpoints and the seconds they blocked training, its paid seconds and its preemptions, kept when the job ends (the
first status call that sees it ended: cloudtrain/providers/__init__.py) under what they measure, never under the
job's name alone: the provider, the machine type, the node count, spot or not, and the job's name. A local rehearsal
never sets a cloud job's interval; two p4d nodes on spot never set one on-demand node's.

One file per run, ``<home>/measured/<name>/<handle>.json`` (written whole or not at all; two processes that see the
same end write the same file), so nothing is read, changed and written back. Only sound figures are kept and used:
finite, not negative, whole counts, at most ``MAX_PAID_S`` of paid time. A run whose figures are not sound (an event
a hand forged, a clock that jumped) is kept as ended with nothing measured, so it is not worked out again at each
status call, and counts for nothing. Files of another shape (an older cloudtrain's ``measured/<name>.json``, keyed by
name alone; one edited by hand) are not read at all: the next plan assumes, as for a job that never ran.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.home.paths import cloudtrain_home

VERSION = 2  # the previous shape (one file per name, rows by job id, no key) had none
MAX_PAID_S = 10 * 365 * 24 * 3600  # ten years of paid time: a run's figure past it is not a measurement
MAX_COUNT = 10**9  # checkpoints or preemptions past it: not counted by a run
MAX_RUNS = 200  # the newest runs of one job name read at plan time (by the time their files were written)
KEY = ("provider", "machine", "nodes", "spot", "name")
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")  # a spec's name (cloudtrain/spec/model.py)
_TOKEN = re.compile(r"[A-Za-z0-9][ -~]{0,199}")  # a provider's name, a machine type ("a node of the cluster")


def key_of(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a job's runs measure, from its ``submitted`` events (the submitter's, and recovery's for a resubmission):
    ``{"provider", "machine", "nodes", "spot", "name"}``, or None where they do not say it all (a job submitted by an
    older cloudtrain)."""
    for event in events:
        if event.get("e") != "submitted" or not all(k in event for k in KEY):
            continue
        key = {k: event[k] for k in KEY}
        return key if valid_key(key) else None
    return None


def valid_key(key: Any) -> bool:
    if not isinstance(key, dict) or set(key) != set(KEY):
        return False
    provider, machine, nodes, spot, name = (key[k] for k in KEY)
    return (isinstance(provider, str) and bool(_TOKEN.fullmatch(provider))
            and (machine is None or (isinstance(machine, str) and bool(_TOKEN.fullmatch(machine))))
            and type(nodes) is int and 1 <= nodes <= 100_000 and type(spot) is bool
            and isinstance(name, str) and bool(_NAME.fullmatch(name)))


def sound(goodput: Any) -> dict[str, Any] | None:
    """The figures of one run from its goodput (cloudtrain/home/goodput.py), where they are sound: ``checkpoints``
    and ``preemptions`` whole counts, ``blocked_s`` (the time checkpoints blocked training) and ``paid_s`` finite
    seconds, none negative, none past ``MAX_PAID_S``; else None."""
    if not isinstance(goodput, dict):
        return None
    losses = goodput.get("losses_s")
    losses = losses if isinstance(losses, dict) else {}
    figures = {"checkpoints": goodput.get("checkpoints"), "preemptions": goodput.get("preemptions"),
               # the checkpoints' losses: ``checkpoint_save`` (ml-goodput-measurement's bucket), once ``checkpoints``
               "blocked_s": losses["checkpoint_save"] if "checkpoint_save" in losses else losses.get("checkpoints"),
               "paid_s": goodput.get("paid_s")}
    return figures if _sound(figures) else None


def _sound(figures: Any) -> bool:
    if not isinstance(figures, dict):
        return False
    counts: list[Any] = [figures.get(k) for k in ("checkpoints", "preemptions")]
    seconds: list[Any] = [figures.get(k) for k in ("blocked_s", "paid_s")]
    return (all(type(c) is int and 0 <= c <= MAX_COUNT for c in counts)
            and all(type(s) in (int, float) and math.isfinite(s) and 0 <= s <= MAX_PAID_S for s in seconds))


def _folder(name: str) -> Path:
    return cloudtrain_home() / "measured" / name


def _file(key: dict[str, Any], handle: str) -> Path:
    return _folder(key["name"]) / (re.sub(r"[^A-Za-z0-9._-]+", "_", handle) + ".json")


def known(key: dict[str, Any], handle: str) -> bool:
    """Whether ``handle``'s end was already taken in (sound figures or none)."""
    return _file(key, handle).exists()


def remember(key: dict[str, Any], handle: str, figures: dict[str, Any] | None) -> None:
    """Keep what the run ``handle`` measured under ``key``; ``figures`` not sound (or None) keep the run as ended
    with nothing measured. Best effort: a home that cannot take it only means the next plan assumes."""
    from cloudtrain.storage.local import atomic_write

    if not valid_key(key):
        return
    record = {"v": VERSION, "handle": handle, "key": key, "figures": figures if _sound(figures) else None}
    text = json.dumps(record, allow_nan=False).encode()
    with contextlib.suppress(OSError):
        atomic_write(_file(key, handle), lambda out: out.write(text))


@dataclass
class Measured:
    """The sums over the sound runs of one key, and how many of its runs were passed over (not sound)."""

    runs: int = 0
    checkpoints: int = 0
    blocked_s: float = 0.0
    paid_s: float = 0.0
    preemptions: int = 0
    unsound: int = 0

    @property
    def cost(self) -> float | None:
        """Seconds blocked per checkpoint, or None where no run checkpointed."""
        return self.blocked_s / self.checkpoints if self.checkpoints > 0 else None

    @property
    def between(self) -> float | None:
        """Paid seconds per preemption, or None where no run was preempted."""
        return self.paid_s / self.preemptions if self.preemptions > 0 else None


def read(key: dict[str, Any]) -> Measured:
    """What the ended runs of ``key`` measured, summed. Anything that is not a run of this shape with this key (a
    file of another version, another provider's or machine's run, one edited by hand, one that cannot be read) is
    not counted; a run of this key whose figures are not sound is counted as ``unsound``. Never raises."""
    from cloudtrain.safe_json import load

    found = Measured()
    if not valid_key(key):
        return found
    try:
        with os.scandir(_folder(key["name"])) as entries:
            files = [(e.stat().st_mtime, e.path) for e in entries if e.name.endswith(".json") and
                     not e.name.startswith(".")]
    except OSError:  # none yet; a file where the folder goes; unreadable; one gone meanwhile
        return found
    for _, path in sorted(files)[-MAX_RUNS:]:
        try:
            record = load(path, max_depth=4)
        except (OSError, ValueError):  # gone meanwhile, unreadable, not JSON (UnreadableJson is a ValueError)
            continue
        if not isinstance(record, dict) or record.get("v") != VERSION or not valid_key(record.get("key")) or \
                record["key"] != key:  # valid_key first: the types too (True == 1, 2.0 == 2 in Python)
            continue
        figures: Any = record.get("figures")
        if not _sound(figures):
            found.unsound += 1
            continue
        sums = (found.checkpoints + figures["checkpoints"], found.blocked_s + figures["blocked_s"],
                found.paid_s + figures["paid_s"], found.preemptions + figures["preemptions"])
        found.runs += 1
        found.checkpoints, found.blocked_s, found.paid_s, found.preemptions = sums
    return found
