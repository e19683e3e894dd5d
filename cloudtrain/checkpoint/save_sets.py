"""Which files one save of a script writes together, known rather than guessed from timing (stdlib only, Python 3.8).

A checkpoint is the whole set of files one save writes: never a subset, never a mix of two saves. Node 0 knows that
set in one of three ways (docs/checkpoints.md, "The set a save writes"):

- **declared** (``checkpoint.files``: globs over paths in the checkpoint folder): a snapshot is a save once every
  glob matches a whole file that is newer than the last checkpoint's copy;
- **learned**: the *keys* every save so far wrote (a file overwritten in place is its own key; every member of a
  family, ``checkpoint-500/``, ``epoch=1-step=8.ckpt``, shares its family's key) must all be written again since
  the last checkpoint, and a family member must hold as many files of each kind as its predecessor, counted over
  every node;
- **not known yet** (the first save of a run, or one that writes a file no save wrote before): learned when the next
  save has begun, which shows the first one was over: a family gains a newer member (the older one is then published
  as it is), or a file written in place since the last checkpoint is written again (every file written since then
  is of the set). A save whose set is not known is published only then, or once the workers ended on their own.

The files of one save overwritten in place are written after the save's first file: a snapshot holding a file
whose newest write came before it holds an earlier save's file, a mix, and waits (the order is learned with the set,
where one kind of file was written strictly first; files of one family member are a save of their own by name).
A key the learned set holds that a save did not write (the save's first file was written again, and it was not) is
no longer held to: the set is what every save wrote.

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
UNKNOWN = "the set of files a save writes is not known yet"
KEPT_WRITES = 5  # of each file's writes since the last checkpoint, the first and the newest few are kept

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


def kind(rel: str) -> str:
    """A file's kind: its path with every number blanked (each rank's ``model_rank_<n>.pt`` is one kind)."""
    return _NUMBER.sub("<n>", rel)


def first_kind(first_written: dict[str, float]) -> str | None:
    """The kind of file a save writes first (``first_written``: each file's first write in it, by mtime), where one
    kind was written strictly before every other; None where the first two tie (written at once, by several ranks)."""
    by_kind: dict[str, float] = {}
    for rel, when in first_written.items():
        by_kind[kind(rel)] = min(by_kind.get(kind(rel), when), when)
    ordered = sorted(by_kind.items(), key=lambda item: item[1])
    if len(ordered) == 1:
        return ordered[0][0]
    return ordered[0][0] if ordered and ordered[0][1] < ordered[1][1] else None


def written_before(changed: dict[str, float], first: str, in_place: Iterable[str]) -> str | None:
    """A file overwritten in place whose newest write came before the save's first file was written (``changed``:
    the snapshot's files new since the last checkpoint, with their mtimes): it is an earlier save's, so the snapshot
    would mix two saves. None where there is no such file, or the first kind is not among ``changed``."""
    starts = [when for rel, when in changed.items() if kind(rel) == first]
    if not starts:
        return None
    start = min(starts)
    older = sorted(rel for rel in in_place if rel in changed and changed[rel] < start)
    return older[0] if older else None


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

    def matching(self, rels: Iterable[str]) -> list[str]:
        return [rel for rel in rels if any(fnmatch.fnmatchcase(rel, glob) for glob in self.globs)]

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


class SaveSet:
    """What node 0 knows of the set of files one save writes: declared, learned, or not known yet (the module's
    words), and each file's writes the looks saw since the last checkpoint, from which it is learned."""

    def __init__(self, declared: Declared, say_once: Callable[[str], None], log: Callable[[str], None],
                 root: str) -> None:
        self.declared, self.say_once, self.log, self.root = declared, say_once, log, root
        self.together: set | None = None  # the keys every save so far wrote (None: not known yet)
        self.first: str | None = None  # the kind of file a save writes first, where one comes strictly first
        self.writes: dict = {}  # rel -> its writes since the last checkpoint: the first, then the newest few

    def restore(self, manifest: dict) -> None:
        """What the restored checkpoint's manifest says of its saves (a restarted node knows the set at once)."""
        known, first = manifest.get("set"), manifest.get("first")
        if isinstance(known, list) and known and all(isinstance(key, str) for key in known):
            self.together = set(known)
            self.first = first if isinstance(first, str) else None

    def fields(self) -> dict:
        return {"set": sorted(self.together or ()), "first": self.first}

    def record(self, files: Files, published: Files) -> None:
        for rel, written in files.items():
            if written != published.get(rel):
                seen = self.writes.setdefault(rel, [])
                if not seen or seen[-1] != written:
                    seen[:] = [*seen[:1], *seen[1:][-(KEPT_WRITES - 2):], written]

    def committed(self, new: Files, changed: set, verdict: Verdict) -> None:
        """A checkpoint was published: what it changed is the set where that was not known yet, and the order of
        its files the order of a save's."""
        if self.together is None and not self.declared:
            self.together = set(changed)
        if self.first is None:
            self.first = first_kind({rel: state.mtime_ns / 1e9 for rel, state in new.items()
                                     if checkpoint_file(rel, verdict)})
        self.writes = {}

    def learn(self, files: Files, verdict: Verdict) -> None:
        """The set, once the next save has begun: a file overwritten in place written a second time since the last
        checkpoint. Every checkpoint file written since is of it; the kind written first starts a save."""
        if self.together is not None or self.declared:
            return
        boxes = containers(files)
        again = sorted(rel for rel in checkpoint_rels(files, verdict)
                       if not family(entry_of(rel, boxes)) and len(self.writes.get(rel, ())) >= 2)
        if not again:
            return
        saved = [rel for rel in self.writes if checkpoint_file(rel, verdict)] or list(self.writes)
        written = {rel: self.writes[rel][0].mtime_ns / 1e9 for rel in saved}
        boxes = containers({rel: self.writes[rel][-1] for rel in written})
        self.together = {key_of(rel, boxes) for rel in written}
        self.first = first_kind(written)
        self.log(f"{again[0]} was written again: a save of {self.root} writes {', '.join(sorted(self.together))}"
                 + (f", {self.first} first" if self.first else ""))

    def judge(self, chosen: list[str], snapshot: Files, changed: set, published: Files, verdict: Verdict,
              others: list[str], final: bool, succeeded: bool) -> str | None:
        """Why the snapshot is not one whole save by what is known of the set, or None; UNKNOWN where it is not known
        (at the end, a set not known is the snapshot itself if the workers ended on their own). ``others``: the other
        nodes' files of its folder entries."""
        boxes = containers(snapshot)
        in_place = [rel for rel in checkpoint_rels(snapshot, verdict) if not family(entry_of(rel, boxes))]
        if self.declared:
            return self.declared.missing(snapshot, others, published) or \
                self._mixed(snapshot, published, self.declared.matching(in_place), verdict, final)
        if self.together is not None:
            return self._against_set(snapshot, changed, published, in_place, verdict, final)
        if final and succeeded:
            return None
        by_entry: dict = {}
        for rel in snapshot:
            by_entry.setdefault(entry_of(rel, boxes), []).append(rel)
        saved = [entry for entry in chosen if any(key_of(rel, boxes) in changed for rel in by_entry.get(entry, []))]
        if all(family(entry) and dcp_member(by_entry[entry]) for entry in saved):
            return None  # a DCP folder says itself it is one whole save
        return UNKNOWN

    def _against_set(self, snapshot: Files, changed: set, published: Files, in_place: list[str], verdict: Verdict,
                     final: bool) -> str | None:
        """A key of the set not written since the last checkpoint, or a file of it overwritten in place written
        before the save's first file (an earlier save's)."""
        assert self.together is not None
        if not final:
            new = sorted(key for key in changed - self.together if key not in keys(published, lambda _rel: None))
            if new:  # the script saves more than its saves did: the set is learned again
                self.say_once(f"a save of {self.root} now writes {new[0]} too: its set is learned again, from the "
                              "next save")
                self.together = None
                return UNKNOWN
            dropped = self._left_out(snapshot)
            if dropped:  # a whole save went by without them: not every save writes them
                self.say_once(f"a save of {self.root} without {dropped[0]}: from now on a checkpoint needs only "
                              f"{', '.join(sorted(self.together - set(dropped)))}")
                self.together -= set(dropped)
        missing = sorted(self.together - changed)
        if missing:
            return (f"{missing[0]} was not written with {sorted(changed)[0]}, as in every save before (the rest of "
                    "the save still being written" + (")" if not final else ", or the save was cut short)"))
        boxes = containers(snapshot)  # files outside the set ride along as they are: no save's order binds them
        return self._mixed(snapshot, published, [rel for rel in in_place if key_of(rel, boxes) in self.together],
                           verdict, final)

    def _left_out(self, snapshot: Files) -> list[str]:
        """Keys of the set overwritten in place that a whole save left out: the save's first file was written twice
        after their newest write (a save began, and the next one too, without them), as model_best.pth.tar beside a
        checkpoint.pth.tar written every epoch."""
        if self.first is None or self.together is None:
            return []
        starts = [state.mtime_ns for rel, seen in self.writes.items() if kind(rel) == self.first for state in seen]
        boxes = containers(snapshot)
        return sorted({rel for rel, state in snapshot.items()
                       if rel in self.together and key_of(rel, boxes) == rel and kind(rel) != self.first
                       and sum(1 for start in starts if start > state.mtime_ns) >= 2})

    def _mixed(self, snapshot: Files, published: Files, in_place: list[str], verdict: Verdict,
               final: bool) -> str | None:
        """A file overwritten in place, new since the last checkpoint, but written before this save's first file:
        an earlier save's, so the snapshot would mix two saves (a look between a save's first file and its last)."""
        if self.first is None:
            return None
        when = {rel: snapshot[rel].mtime_ns / 1e9 for rel in checkpoint_rels(snapshot, verdict)
                if snapshot[rel] != published.get(rel)}
        older = written_before(when, self.first, in_place)
        if older:
            return (f"{older} was written before this save's {self.first} (an earlier save's: the rest of this save "
                    "still being written" + (")" if not final else ", or the save was cut short)"))
        return None
