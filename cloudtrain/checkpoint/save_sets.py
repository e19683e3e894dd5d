"""Which files one save of a script writes together, known rather than guessed from timing (stdlib only, Python 3.8).

A checkpoint is the whole set of files one save writes: never a subset, never a mix of two saves. Node 0 knows that
set in one of three ways (docs/checkpoints.md, "The set a save writes"):

- **declared** (``checkpoint.files``: globs over paths in the checkpoint folder): a snapshot is a save once every
  glob matches a whole file that is newer than the last checkpoint's copy;
- **learned**: the *keys* that changed together in the previous save (a file overwritten in place is its own key;
  every member of a family, ``checkpoint-500/``, ``epoch=1-step=8.ckpt``, shares its family's key) must all change
  again, and a family member must hold as many files of each kind as its predecessor, counted over every node;
- **not known yet** (the first save of a run, or one that writes a file no save wrote before): the save is uploaded
  (staged, no manifest) and published only once the *next* save has begun, which proves this one was over, or once
  the workers ended.

Only checkpoint files count as a save's members: a file in a format that says whether it is whole (torch's zip,
safetensors) or named as torch saves are (``.pt``, ``.bin``, ...), a DCP shard, a family's folder. Logs and notes
ride along with the snapshot but never make one. A folder whose files are of no such kind (a script saving
``.npz`` or ``.msgpack``) has every file count.
"""

from __future__ import annotations

import collections
import fnmatch
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from cloudtrain.checkpoint.files import CHECKPOINT_SUFFIXES, Files, containers, entry_of, family

_NUMBER = re.compile(r"\d+")

Verdict = Callable[[str], Optional[bool]]  # a file's format says it is whole (True), cut short (False), or nothing


def key_of(rel: str, boxes: frozenset) -> str:
    """The key of a file in a save: its family's name for a family member's file (every member of a family is the
    same member of each save), else its own path."""
    found = family(entry_of(rel, boxes))
    return found[0] if found else rel


def checkpoint_file(rel: str, verdict: Verdict) -> bool:
    """A file a save writes as checkpoint state, by its name or its format (not a log, not a note)."""
    name = Path(rel).name
    return rel.endswith(CHECKPOINT_SUFFIXES) or name == ".metadata" or verdict(rel) is not None


def checkpoint_rels(snapshot: Files, verdict: Verdict) -> list[str]:
    """The snapshot's checkpoint files; every file where none is of a kind cloudtrain knows."""
    found = [rel for rel in snapshot if checkpoint_file(rel, verdict)]
    return found or list(snapshot)


def changed_keys(snapshot: Files, before: Files, verdict: Verdict) -> set:
    """The keys of the snapshot's checkpoint files that differ from ``before`` (the last checkpoint): new files, new
    family members, files rewritten in place."""
    boxes = containers(snapshot)
    return {key_of(rel, boxes) for rel in checkpoint_rels(snapshot, verdict) if before.get(rel) != snapshot[rel]}


def keys(snapshot: Files, verdict: Verdict) -> set:
    boxes = containers(snapshot)
    return {key_of(rel, boxes) for rel in checkpoint_rels(snapshot, verdict)}


def next_save_began(staged: Files, entries: Iterable[str], now: Files, changed: Iterable[str]) -> str | None:
    """What shows that the save ``staged`` holds is over because the next one has begun: a newer member of one of its
    families, or one of the checkpoint files it wrote (``changed``) overwritten in place again, or removed (a file
    it did not write changing is the same save going on). None while neither is seen."""
    current = {entry_of(rel, containers(now)) for rel in now}
    for entry in entries:
        found = family(entry)
        if not found:
            continue
        newer = sorted(e for e in current if (f := family(e)) and f[0] == found[0] and f[1] > found[1])
        if newer:
            return f"{newer[-1]} was begun"
    boxes = containers(staged)
    for rel in sorted(changed):
        if not family(entry_of(rel, boxes)) and now.get(rel) != staged[rel]:
            return f"{rel} was {'rewritten' if rel in now else 'removed'}"
    return None


def ambiguous(staged: Files, entries: Iterable[str], now: Files, changed: Iterable[str],
              verdict: Verdict) -> str | None:
    """What, in the look that showed the next save begun, might still belong to the save ``staged`` holds, so that
    the staged snapshot may be a part of it: one of its family members grown, one of its checkpoint files it had
    not written (``changed``) rewritten, a checkpoint file of no newer family member new. None where only the next
    save's own writes are seen (and logs, which never make a save)."""
    boxes_now, boxes_staged = containers(now), containers(staged)
    entries = list(entries)
    for entry in entries:
        if family(entry) and {r: s for r, s in now.items() if entry_of(r, boxes_now) == entry} != \
                {r: s for r, s in staged.items() if entry_of(r, boxes_staged) == entry}:
            return f"{entry} changed"
    written = set(changed)
    for rel in sorted(checkpoint_rels(staged, verdict)):
        if rel not in written and not family(entry_of(rel, boxes_staged)) and now.get(rel) != staged[rel]:
            return f"{rel} changed"
    newer = {}
    for entry in entries:
        found = family(entry)
        if found:
            newer[found[0]] = found[1]
    for rel in sorted(set(now) - set(staged)):
        found = family(entry_of(rel, boxes_now))
        if found and found[0] in newer and found[1] > newer[found[0]]:
            continue  # the next save's own member
        if checkpoint_file(rel, verdict):
            return f"{rel} appeared"
    return None


def kind_counts(entry: str, rels: Iterable[str]) -> collections.Counter:
    """How many files of each kind a folder entry holds: their paths in it with every number blanked
    (``random_states_0.pkl`` and ``random_states_1.pkl`` are two files of one kind)."""
    return collections.Counter(_NUMBER.sub("<n>", rel[len(entry) + 1:]) for rel in rels if rel.startswith(entry + "/"))


def fewer_than(entry: str, rels: list[str], before: str, before_rels: list[str], counted: bool) -> str | None:
    """Why a family member holds less than the member before it (a save still being written, on some node), or
    None. ``counted``: compare how many files of each kind (the same world size); else only that each kind is there
    (a save at another world size holds another number of per-rank files)."""
    now, then = kind_counts(entry, rels), kind_counts(before, before_rels)
    for kind, count in sorted(then.items()):
        if now[kind] == 0:
            return f"it has no {kind}, which {before} has (still being written, or stopped while it was written?)"
        if counted and now[kind] < count:
            return (f"it has {now[kind]} file(s) {kind} where {before} has {count} (another rank's still being "
                    "written?)")
    return None


def dcp_member(rels: Iterable[str]) -> bool:
    """A DCP folder: its ``.metadata`` is written by rank 0 after every rank's shard, so with a shard of every rank
    it vouches for itself being one whole save."""
    names = {Path(rel).name for rel in rels}
    return ".metadata" in names and any(name.endswith(".distcp") for name in names)


class Declared:
    """``checkpoint.files``: globs over paths in the checkpoint folder (``*`` crosses ``/``: ``checkpoint-*/model.pt``
    matches in every member of the family)."""

    def __init__(self, globs: Iterable[str]) -> None:
        self.globs = [g for g in globs if g]

    def __bool__(self) -> bool:
        return bool(self.globs)

    def missing(self, snapshot: Files, others: list[str], before: Files) -> str | None:
        """Why the snapshot is not a whole save by the declared set: a glob matching no file, or only files no
        newer than the last checkpoint's copy. ``others``: other nodes' files of its folder entries."""
        for glob in self.globs:
            mine = [rel for rel in snapshot if fnmatch.fnmatchcase(rel, glob)]
            theirs = [rel for rel in others if fnmatch.fnmatchcase(rel, glob)]
            if not mine and not theirs:
                return f"no file matches {glob} (checkpoint.files) yet"
            stale = [rel for rel in mine if before.get(rel) == snapshot[rel]]
            if stale:
                return f"{stale[0]} (checkpoint.files {glob}) is the last checkpoint's copy"
        return None


def parse_declared(text: str | None) -> list[str]:
    """CLOUDTRAIN_CHECKPOINT_FILES: one glob per line."""
    return [line.strip() for line in (text or "").splitlines() if line.strip()]

