"""Checkpoints in the layouts real training stacks write, published whole and never torn (stdlib only, Python 3.8).

A script writes its checkpoints into its checkpoint folder (``checkpoint.dir``, else CLOUDTRAIN_CHECKPOINT_DIR) the
way its stack does: nanoGPT overwrites ``ckpt.pt`` in place, the HF Trainer adds ``checkpoint-<N>/`` folders,
Lightning ``epoch=E-step=S.ckpt`` beside ``last.ckpt``, Accelerate ``checkpoints/checkpoint_<i>/``, DCP folders end
with ``.metadata``. What node 0 publishes is a *snapshot* of that folder: each top-level entry is a unit; of the
entries whose names differ only in their numbers (a family: ``checkpoint-500``, ``checkpoint-1000``) only the newest
is taken; every other entry is taken as it is. A snapshot becomes checkpoint ``<uri>/step-<G>/`` with a manifest
(``"layout": "dir"``: file paths relative to the checkpoint folder), so the checkpoint protocol's rules hold for it
unchanged (manifest last, verified restore, quarantine, retention). ``G`` increases with every snapshot: the
script's own step where a family's name carries one, else the next number. A restore puts its files back under the
names the script wrote and adds nothing beside them.

When is a snapshot complete? Never while a file in it is being written: a file in torch's zip format is complete
only once its central directory (written last) is there, a safetensors file once it holds as many bytes as its
header declares, a DCP folder once its ``.metadata`` exists, an HF Trainer folder once its ``trainer_state.json``
does; anything else (and a folder, which may still gain files) once nothing in the snapshot has changed for a quiet
period. After the workers exited, everything that is complete is final. A file whose bytes change while it is
uploaded makes that snapshot void (its manifest is never written); the next one is taken when it has settled.

The ``step-<N>/`` folders cloudtrain's own layout uses are published per folder as before (sync.sync_dir).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from cloudtrain import contract, storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.files import (
    CHECKPOINT_SUFFIXES,
    Files,
    FileState,
    containers,
    entry_of,
    family,
    file_complete,
    marker_missing,
    scan,
    state_of,
)
from cloudtrain.checkpoint.manifest import LAYOUT_DIR, is_dir_layout, step_dir, step_of
from cloudtrain.checkpoint.parts import NodeParts, Part
from cloudtrain.checkpoint.retention import apply_retention

QUIET = 2.0  # seconds a snapshot must stay unchanged before it is taken for complete (CLOUDTRAIN_CHECKPOINT_QUIET)
LIVE_AFTER = 10  # a file of no known format that changed at this many scans in a row is a log, not a checkpoint
_NUMBER = re.compile(r"\d+")


def quiet_period(env: dict[str, str] | None = None) -> float:
    value = (env if env is not None else os.environ).get(contract.CHECKPOINT_QUIET)
    try:
        return max(0.0, float(value)) if value else QUIET
    except ValueError:
        return QUIET


# -- units and families ------------------------------------------------------------------------------------------


def units(files: Files) -> dict[str, list[str]]:
    """Entry (a top-level name, or a family member inside a container) -> the files in it."""
    boxes = containers(files)
    found: dict[str, list[str]] = {}
    for rel in sorted(files):
        found.setdefault(entry_of(rel, boxes), []).append(rel)
    return found


def newest_first(names: list[str]) -> list[str]:
    """Each family's members newest first, ahead of the entries that are no family's (in name order)."""
    series: dict[str, list[tuple[tuple[int, ...], str]]] = {}
    fixed = []
    for name in names:
        found = family(name)
        if found:
            series.setdefault(found[0], []).append((found[1], name))
        else:
            fixed.append(name)
    ordered = [name for members in series.values() for _, name in sorted(members, reverse=True)]
    return ordered + sorted(fixed)


def kinds(entry: str, rels: list[str]) -> set[str]:
    """The kinds of file a folder entry holds: their paths in it with every number blanked (``random_states_0.pkl``
    and ``random_states_3.pkl`` are one kind, so a save at another world size holds the same kinds)."""
    return {_NUMBER.sub("<n>", rel[len(entry) + 1:]) for rel in rels if rel.startswith(entry + "/")}


def predecessors(order: list[str]) -> dict[str, str]:
    """Each family member (in ``newest_first`` order) -> the member just older than it."""
    found = {}
    for newer, older in zip(order, order[1:]):
        one, other = family(newer), family(older)
        if one and other and one[0] == other[0]:
            found[newer] = older
    return found


def script_step(names: list[str]) -> int | None:
    """The step a snapshot stands for, where a family member's name carries it (its last number)."""
    steps = [found[1][-1] for found in map(family, names) if found]
    return max(steps) if steps else None


class Snapshotter:
    """What node 0 runs around the workers for one checkpoint folder: ``poll()`` while they run (from the sync
    thread), ``poll(final=True)`` once they exited. Keeps what it saw between polls in memory (the bootstrap's
    process lives as long as the node); writes nothing into the folder."""

    def __init__(self, root: Path, uri: str, keep: int, quiet: float = QUIET, log: Any = None,
                 world_size: int = 0, step_folders: bool = True, parts: NodeParts | None = None) -> None:
        self.root, self.uri, self.keep, self.quiet = root, uri, keep, quiet
        # on several nodes a DCP folder's shards are counted over every node's files (other_nodes), not node 0's
        self.world_size, self.ranks = (0 if parts else world_size), world_size
        self.parts = parts  # the other nodes' files of each folder entry (checkpoint_parts), where there are others
        self.step_folders = step_folders  # False: cloudtrain's step-<N> folders are published one by one elsewhere
        self.log = log or checkpoint_store.log_line
        self.published: Files = self._scan()  # what the folder held when the node started: restored, in the store
        self.seen: dict[str, Files] = _by_entry(self.published)
        self.changed_at: dict[str, float] = {}  # entry -> when a poll last found it changed
        self.changes: dict[str, int] = {}  # entry -> polls in a row that found it changed
        self.verdicts: dict[tuple[str, FileState], bool | None] = {}
        self.next_step: int | None = None  # the store's newest step folder + 1, once listed
        self.said: set = set()
        self.unpublished: list[str] = []  # after the final poll: what the folder holds that is not in the store
        self.members: set[str] = self._checkpoint_entries(self.published)  # the last snapshot's checkpoint files
        self.voided = 0  # snapshots voided by a rewrite during their upload: later ones upload from a copy

    def _scan(self) -> Files:
        return scan(self.root, self.step_folders)

    def _freeze(self, rels: list[str], snapshot: Files) -> Path | None:
        """A copy of the snapshot's files beside the folder (the same file system: copy_file_range, a reflink
        where it can), taken in a moment rather than over a whole upload, for a script that rewrites its
        checkpoint faster than it uploads. None (and the copy gone) where a file changed while it was copied."""
        frozen = self.root.parent / f".{self.root.name}.snapshot"
        shutil.rmtree(frozen, ignore_errors=True)
        try:
            for rel in rels:
                target = frozen / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.root / rel, target)
        except OSError as exc:  # no room beside it: the next snapshot is uploaded from the folder again
            self.log(f"could not copy the snapshot beside {self.root} ({exc}); the next is uploaded from the folder")
            self.voided = 0
        if self.voided and all(state_of(self.root / rel) == snapshot[rel] for rel in rels):
            return frozen
        shutil.rmtree(frozen, ignore_errors=True)
        return None

    def _checkpoint_entries(self, files: Files) -> set[str]:
        """The entries of a snapshot holding a file whose format says it is a whole checkpoint file (torch's zip,
        safetensors): what a later snapshot must hold too (or a newer member of their family). Logs and notes are
        not held to that."""
        return {entry for entry, found in _by_entry(files).items()
                if any(self._complete(rel, state) for rel, state in found.items())}

    def _look(self, now: float) -> Files:
        files = self._scan()
        current = _by_entry(files)
        for entry, state in current.items():
            if self.seen.get(entry) != state:
                self.changes[entry] = self.changes.get(entry, 0) + 1
                self.changed_at[entry] = now
            else:
                self.changes[entry] = 0
        self.seen = current
        self.verdicts = {key: v for key, v in self.verdicts.items() if files.get(key[0]) == key[1]}  # current ones
        return files

    def _complete(self, rel: str, state: FileState) -> bool | None:
        key = (rel, state)
        if key not in self.verdicts:  # a zip's central directory is read once per version of the file
            self.verdicts[key] = file_complete(self.root / rel)
        return self.verdicts[key]

    def _unit_state(self, entry: str, rels: list[str], files: Files) -> tuple[str | None, bool, bool]:
        """(why the entry is not complete, or None; whether it is one file whose format vouches for it being whole;
        whether no file of it has a format that can say: a log, notes, but no checkpoint file cloudtrain knows)."""
        verdicts = [self._complete(rel, files[rel]) for rel in rels]
        unknown = all(verdict is None for verdict in verdicts)
        empty = [rel for rel in rels if files[rel].size == 0 and (
            rel.endswith(CHECKPOINT_SUFFIXES) or getattr(self.published.get(rel), "size", 0) > 0)]
        if empty:  # a save that never wrote a byte (torch.save writes at least a zip's end record)
            return f"{empty[0]} is empty (a save that wrote nothing, or was cut off at its start)", False, False
        torn = [rel for rel, verdict in zip(rels, verdicts) if verdict is False]
        if torn:
            return f"{torn[0]} is incomplete (being written, or cut short)", False, unknown
        missing = marker_missing(entry, rels, self.world_size)
        if missing:
            return f"it has no {missing} (its stack writes that file last)", False, unknown
        return None, verdicts == [True], unknown

    def choose(self, files: Files, now: float, final: bool) -> tuple[list[str] | None, dict[str, str]]:
        """The entries of the snapshot to take now (None: not now), and the entries left out, with why."""
        by_entry = units(files)
        chosen: list[str] = []
        left: dict[str, str] = {}
        taken: set = set()
        whole = False  # the snapshot is one file whose format vouches for it (a save of one file is over)
        order = newest_first(list(by_entry))
        previous = predecessors(order)
        for entry in order:
            found = family(entry)
            if found and found[0] in taken:
                continue  # an older member of a family whose newer one is taken
            if not final and entry in previous and now - self.changed_at.get(entry, -self.quiet) < self.quiet:
                continue  # being written, or just written: the member before it, once settled, stands in (a
                # script that saves more often than the quiet period still gets its checkpoints published)
            why, vouched, unknown = self._unit_state(entry, by_entry[entry], files)
            if final and not why and entry in previous:
                # no quiet period can tell any more: a save of files each whole on its own (Accelerate's model,
                # optimizer, RNG states, registered objects) stopped between two of them holds fewer kinds of file
                # than the save before it (while the workers run, the quiet period decides: a script may change
                # what it saves)
                before = previous[entry]
                missing = sorted(kinds(before, by_entry[before]) - kinds(entry, by_entry[entry]))
                if missing:
                    why = f"it has no {missing[0]}, which {before} has (stopped while it was written?)"
            # a file of no checkpoint format that changes at every look is a log: it must not hold back every
            # snapshot (a checkpoint file being written does hold it back, however long it takes)
            if not final and unknown and self.changes.get(entry, 0) >= LIVE_AFTER:
                if entry not in self.said:
                    self.said.add(entry)
                    self.log(f"{self.root / entry} changes at every look (a log?): left out of checkpoints until the "
                             "job ends")
                continue
            if why:
                if not final:
                    return None, left  # being written: the snapshot waits for it
                left[entry] = why
                continue  # an older member of its family may stand in for it
            if found:
                taken.add(found[0])
            chosen.append(entry)
            whole = vouched and len(chosen) == 1
        # taken as a whole: what one save writes one file after another (a model, then its optimizer) belongs
        # together, so nothing in the snapshot may have changed within the quiet period, unless it is one file that
        # says itself it is whole (after the workers exited, nothing changes any more)
        if not final and not whole and any(now - self.changed_at.get(entry, -self.quiet) < self.quiet
                                           for entry in chosen):
            return None, left
        gone = self._members_gone(by_entry)
        if gone and not final:
            return None, left  # a checkpoint file of the last snapshot is being replaced: wait for it
        # never a subset of the set of files a save makes up: an entry left out with nothing of its family standing
        # in for it (a torn model.pt beside a whole optim.pt; a ckpt.pt cut short beside a grown metrics.jsonl), or
        # a checkpoint file of the last snapshot gone, and the previous snapshot stands
        alone = sorted(entry for entry in left if (family(entry) or ("", ()))[0] not in taken)
        if chosen and (alone or gone):
            for entry in gone:
                left[entry] = "it was in the last checkpoint and is gone (being replaced?)"
            why = left[(alone or gone)[0]]
            self._say_once(f"not published: {(alone or gone)[0]} ({why}); a checkpoint is every file a save "
                           "writes, so the previous one stands")
            return None, left
        return chosen, left

    def _other_nodes(self, chosen: list[str], snapshot: Files, final: bool) -> list[Part] | None:
        """The other nodes' parts of the snapshot's folder entries ([] on one node); None where one is missing
        (still being written, or never uploaded), or a DCP folder lacks a rank's shard on every node: a checkpoint
        is every node's files of a save, so nothing is published then."""
        if self.parts is None:
            return []
        folders = sorted({entry for entry in chosen if any(rel.startswith(entry + "/") for rel in snapshot)})
        if not folders:
            return []
        found, problems = self.parts.complete(folders, list(snapshot), final, self.ranks)
        if not problems:
            return [part for entry in folders for part in found[entry]]
        entry = sorted(problems)[0]
        if final:
            self.unpublished += [f"{self.root / e} ({why})" for e, why in sorted(problems.items())]
            self._say_once(f"not published: {entry} ({problems[entry]}); a checkpoint is every node's files of a "
                           "save, so the previous one stands")
        return None

    def _upload_parts(self, parts: list[Part], own: set, folder: str) -> list[dict[str, Any]]:
        """The other nodes' files into the checkpoint's folder; a name node 0 holds too is node 0's file."""
        entries: list[dict[str, Any]] = []
        for part in parts:
            files = [f for f in part.files if f["path"] not in own]
            own.update(f["path"] for f in files)
            checkpoint_store.carry_files(part.root, files, folder, log=self.log)
            entries += files
        return entries

    def _members_gone(self, by_entry: dict[str, list[str]]) -> list[str]:
        """Entries of the last snapshot published (or restored) that held a checkpoint file (one whose format says
        it is whole) and are no longer in the folder, where nothing of their family took their place."""
        present = {found[0] for found in map(family, by_entry) if found}
        return sorted(entry for entry in self.members if entry not in by_entry
                      and not ((found := family(entry)) and found[0] in present))

    def _say_once(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            self.log(line)

    def _generation(self, names: list[str]) -> int:
        if self.next_step is None:  # 0 in an empty store: a script's own step 0 (Accelerate's checkpoint_0) is 0
            self.next_step = max(checkpoint_store.steps_present(self.uri), default=-1) + 1
        step = script_step(names)
        return max(self.next_step, step if step is not None else 1)

    def poll(self, final: bool = False) -> int | None:
        """Publish the folder's snapshot if it is complete and differs from the last one published (or restored).
        Returns its step, or None. Raises CloudtrainError (or OSError) when the store refuses it."""
        now = time.monotonic()
        files = self._look(now)
        if not self.step_folders and files and _holds_step_folders(self.root):
            # the checkpoints are the step-<N> folders (published one by one): a file beside them (a final export,
            # a log) is part of none, and never a checkpoint of its own
            if final:
                self.unpublished = [f"{self.root / entry} (beside the step-<N> folders, in none of them: not part of "
                                    "a checkpoint; write a final export to CLOUDTRAIN_OUTPUT_DIR)"
                                    for entry in sorted(_by_entry(files))]
            return None
        chosen, left = self.choose(files, now, final)
        if final:
            self.unpublished = [f"{self.root / entry} ({why})" for entry, why in sorted(left.items())]
        if not chosen:
            return None
        boxes = containers(files)
        snapshot = {rel: state for rel, state in files.items() if entry_of(rel, boxes) in chosen}
        if all(self.published.get(rel) == state for rel, state in snapshot.items()):
            return None  # nothing new since the last snapshot, or the restore
        extra = self._other_nodes(chosen, snapshot, final)
        if extra is None:
            return None
        step = self._generation(chosen)
        folder = storage.join(self.uri, step_dir(step))
        self.next_step = step + 1  # a void attempt's objects never mix with the next attempt's
        rels = sorted(snapshot)
        frozen = self._freeze(rels, snapshot) if self.voided else None
        if self.voided and frozen is None:
            return None  # rewritten while it was copied: the next look tries again
        started = time.monotonic()
        try:
            entries = checkpoint_store.describe_and_upload(frozen or self.root, rels, folder, log=self.log,
                                                           immutable=frozen is not None)
        finally:
            if frozen is not None:
                shutil.rmtree(frozen, ignore_errors=True)
        entries += self._upload_parts(extra, set(rels), folder)
        changed = [] if frozen else [rel for rel in rels if state_of(self.root / rel) != snapshot[rel]]
        if changed:  # rewritten while it was read: what reached the store may mix two versions
            self.voided += 1
            self.log(f"{self.root / changed[0]} changed while it was uploaded ({time.monotonic() - started:.1f}s); "
                     "from now on each snapshot is copied on this node first (the copy takes a moment, the upload "
                     "is then unhurried) and uploaded from the copy")
            return None
        checkpoint_store.publish(folder, step, entries, world_size=0, kind="snapshot", log=self.log,
                            extra={"layout": LAYOUT_DIR, "entries": chosen, "script_step": script_step(chosen)})
        self.published = snapshot
        if self.parts is not None:
            self.parts.taken(extra, published=folder)
        self.members = self._checkpoint_entries(snapshot)
        self.log(f"published {', '.join(chosen)} from {self.root} as {folder}")
        try:  # the checkpoint stands; what retention misses now, the next publish's retention removes
            apply_retention(self.uri, self.keep, log=self.log)
        except Exception as exc:
            self.log(f"retention under {self.uri} failed ({exc}); the next publish tries again")
        return step


def _holds_step_folders(root: Path) -> bool:
    try:
        return any(e.is_dir(follow_symlinks=False) and step_of(e.name, False) is not None for e in os.scandir(root))
    except OSError:
        return False


def _by_entry(files: Files) -> dict[str, Files]:
    boxes = containers(files)
    found: dict[str, Files] = {}
    for rel, state in files.items():
        found.setdefault(entry_of(rel, boxes), {})[rel] = state
    return found


def resume_point(uri: str | None) -> str:
    """What a restart of a job with this checkpoint URI starts from, in words: ``from checkpoint N (...) under URI``
    or ``from scratch: ...`` (what `preempt`, `wait` and `status` say, so a restart never claims a resume)."""
    if not uri:
        return "from scratch: the job has no checkpoint.uri"
    complete = checkpoint_store.list_complete(uri, log=lambda _message: None)
    if not complete:
        return f"from scratch: no checkpoint is published under {uri} yet"
    newest = complete[-1]
    entries = newest.manifest.get("entries") if is_dir_layout(newest.manifest) else None
    what = f" ({', '.join(map(str, entries))})" if isinstance(entries, list) and entries else ""
    return f"from checkpoint {newest.step}{what} under {uri}"
