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

When is a snapshot a checkpoint? When it is one whole save, by the set of files a save writes (save_sets.py:
declared, learned from the saves, or not known yet until the next save begins), and none of its files is being
written (torch's zip and safetensors say when they are whole, DCP's ``.metadata`` and the HF Trainer's
``trainer_state.json`` when a folder is; any other file once it has not changed for a quiet period). A file whose
bytes change while it is uploaded voids that upload; the next look takes it again.

The ``step-<N>/`` folders cloudtrain's own layout uses are published per folder as before (sync.sync_dir).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from cloudtrain import contract, storage
from cloudtrain.checkpoint import save_sets
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.files import (
    CHECKPOINT_SUFFIXES,
    Files,
    FileState,
    containers,
    entry_files,
    entry_of,
    family,
    file_complete,
    marked_done,
    marker_missing,
    newest_first,
    predecessors,
    scan,
    script_step,
    state_of,
    units,
)
from cloudtrain.checkpoint.manifest import LAYOUT_DIR, is_dir_layout, step_dir, step_of
from cloudtrain.checkpoint.parts import NodeParts, Part
from cloudtrain.checkpoint.retention import apply_retention

QUIET = 2.0  # seconds a snapshot must stay unchanged before it is taken for complete (CLOUDTRAIN_CHECKPOINT_QUIET)
LIVE_AFTER = 10  # a file of no known format that changed at this many scans in a row is a log, not a checkpoint


def quiet_period(env: dict[str, str] | None = None) -> float:
    value = (env if env is not None else os.environ).get(contract.CHECKPOINT_QUIET)
    try:
        return max(0.0, float(value)) if value else QUIET
    except ValueError:
        return QUIET


class Snapshotter:
    """What node 0 runs around the workers for one checkpoint folder: ``poll()`` while they run (from the sync
    thread), ``poll(final=True)`` once they exited. Keeps what it saw between polls in memory (the bootstrap's
    process lives as long as the node); writes nothing into the folder."""

    def __init__(self, root: Path, uri: str, keep: int, quiet: float = QUIET, log: Any = None,
                 world_size: int = 0, step_folders: bool = True, parts: NodeParts | None = None,
                 files: Iterable[str] = (), announce: Callable[..., None] | None = None) -> None:
        self.root, self.uri, self.keep, self.quiet = root, uri, keep, quiet
        # on several nodes a DCP folder's shards are counted over every node's files (other_nodes), not node 0's
        self.world_size, self.ranks = (0 if parts else world_size), world_size
        self.parts = parts  # the other nodes' files of each folder entry (checkpoint_parts), where there are others
        self.step_folders = step_folders  # False: cloudtrain's step-<N> folders are published one by one elsewhere
        self.log = log or checkpoint_store.log_line
        self.announce = announce  # the node's timeline: each checkpoint published is an event
        self.published: Files = self._scan()  # what the folder held when the node started: restored, in the store
        self.restored = set(entry_files(self.published))
        self.seen: dict[str, Files] = entry_files(self.published)
        self.changed_at: dict[str, float] = {}  # entry -> when a poll last found it changed
        self.changes: dict[str, int] = {}  # entry -> polls in a row that found it changed
        self.verdicts: dict[tuple[str, FileState], bool | None] = {}
        self.next_step: int | None = None  # the store's newest step folder + 1, once listed
        self.said: set = set()
        self.unpublished: list[str] = []  # after the final poll: what the folder holds that is not in the store
        self.members: set[str] = self._checkpoint_entries(self.published)  # the last snapshot's checkpoint files
        self.voided = 0  # snapshots voided by a rewrite during their upload: later ones upload from a copy
        self.set = save_sets.SaveSet(save_sets.Declared(files), self._say_once, self.log, str(root))
        self.restored_ranks: int | None = None  # the world size that wrote the restored checkpoint
        self.known = False  # the restored checkpoint's manifest was read (its set, its world size)
        self.asked: tuple[Any, str] | None = None  # (the snapshot, node 0's question to the other nodes about it)

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
        return {entry for entry, found in entry_files(files).items()
                if any(self._complete(rel, state) for rel, state in found.items())}

    def _look(self, now: float) -> Files:
        files = self._scan()
        current = entry_files(files)
        for entry, state in current.items():
            if self.seen.get(entry) != state:
                self.changes[entry] = self.changes.get(entry, 0) + 1
                self.changed_at[entry] = now
            else:
                self.changes[entry] = 0
        self.seen = current
        self.verdicts = {key: v for key, v in self.verdicts.items() if files.get(key[0]) == key[1]}  # current ones
        self.set.record(files, self.published)
        return files

    def _complete(self, rel: str, state: FileState) -> bool | None:
        key = (rel, state)
        if key not in self.verdicts:  # a zip's central directory is read once per version of the file
            self.verdicts[key] = file_complete(self.root / rel)
        return self.verdicts[key]

    def _verdict(self, files: Files) -> Callable[[str], bool | None]:
        return lambda rel: self._complete(rel, files[rel]) if rel in files else None

    def _read_store(self) -> None:
        """Once: what the restored checkpoint's manifest says of the set its saves wrote and of its world size, so a
        restarted node knows the set without waiting for a save to show it."""
        if self.known:
            return
        self.known = True
        if not self.published:
            return
        try:
            complete = checkpoint_store.list_complete(self.uri, log=lambda _message: None)
        except Exception:  # a store that cannot be listed now: the set is learned from the saves, as on a first run
            return
        manifest = complete[-1].manifest if complete else {}
        if not is_dir_layout(manifest) or sorted(f["path"] for f in manifest["files"]) != sorted(self.published):
            return  # not what was restored here
        self.set.restore(manifest)
        ranks = manifest.get("ranks")
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            self.restored_ranks = ranks

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

    def _listed(self, entry: str) -> list[str]:
        """The other nodes' files of a folder entry, as their indexes said at this poll."""
        return self.parts.listed(entry) if self.parts is not None else []

    def _fewer(self, entry: str, before: str, by_entry: dict[str, list[str]]) -> str | None:
        """A family member holding fewer files of some kind than the member before it, counted over every node:
        a save still being written somewhere (or stopped while it was written)."""
        # a member this run wrote is counted file by file (the world size is the same); one restored from a run at
        # another world size holds another number of per-rank files, so there only each kind must be there
        counted = before not in self.restored or self.restored_ranks == self.ranks
        return save_sets.fewer_than(entry, by_entry[entry] + self._listed(entry), before,
                                    by_entry[before] + ([] if before in self.restored else self._listed(before)),
                                    counted)

    def choose(self, files: Files, now: float, final: bool,
               older: bool = False) -> tuple[list[str] | None, dict[str, str]]:
        """The entries of the snapshot to take now (None: not now), and the entries left out, with why. ``older``:
        of each family only a member older than its newest (one whose save is over: the next has begun)."""
        by_entry = units(files)
        chosen: list[str] = []
        left: dict[str, str] = {}
        taken: set = set()
        order = newest_first(list(by_entry))
        previous = predecessors(order)
        newest = {found[0] for found in map(family, order) if found}
        for entry in order:
            found = family(entry)
            if found and found[0] in taken:
                continue  # an older member of a family whose newer one is taken
            if older and found and found[0] in newest:
                newest.discard(found[0])
                continue
            why, _vouched, unknown = self._unit_state(entry, by_entry[entry], files)
            if not why and entry in previous:  # a member holds every kind of file the one before it holds
                why = self._fewer(entry, previous[entry], by_entry)
            # a file of no checkpoint format that changes at every look is a log: it must not hold back every
            # snapshot (a checkpoint file being written does hold it back, however long it takes)
            if not final and unknown and self.changes.get(entry, 0) >= LIVE_AFTER:
                if entry not in self.said:
                    self.said.add(entry)
                    self.log(f"{self.root / entry} changes at every look (a log?): left out of checkpoints until the "
                             "job ends")
                continue
            if why:
                left[entry] = why
                if final or entry in previous:
                    continue  # an older member of its family stands in for it
                return None, left  # being written: the snapshot waits for it
            if found:
                taken.add(found[0])
            chosen.append(entry)
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

    def _settled(self, entries: list[str], snapshot: Files, now: float) -> bool:
        """Whether the snapshot's files of no format that can say they are whole have stopped changing for the
        quiet period (an entry whose stack marks it done, DCP's ``.metadata``, the HF Trainer's
        ``trainer_state.json``, needs no wait)."""
        grouped = entry_files(snapshot)
        for entry in entries:
            rels = list(grouped.get(entry, {}))
            if marked_done(entry, rels):
                continue
            unknown = [rel for rel in rels if self._complete(rel, snapshot[rel]) is None
                       and self.published.get(rel) != snapshot[rel]]
            if unknown and now - self.changed_at.get(entry, -self.quiet) < self.quiet:
                return False
        return True

    def _not_whole(self, chosen: list[str], snapshot: Files, changed: set, now: float, final: bool,
                   succeeded: bool = True) -> str | None:
        """Why the snapshot is not (yet) one whole save by what is known of the set its saves write (save_sets), or
        None; UNKNOWN where that set is not known yet."""
        folders = [entry for entry in chosen if any(rel.startswith(entry + "/") for rel in snapshot)]
        why = self.set.judge(chosen, snapshot, changed, self.published, self._verdict(snapshot),
                             [rel for entry in folders for rel in self._listed(entry)], final, succeeded)
        if why:
            return why
        if not final and not self._settled(chosen, snapshot, now):
            return "its files of no known format are still changing"
        return None

    def _other_nodes(self, chosen: list[str], snapshot: Files, final: bool) -> list[Part] | None:
        """The other nodes' parts of the snapshot's folder entries ([] on one node); None where one is missing
        (still being written, or never uploaded), a node has not looked at its folder since node 0 found the
        snapshot whole here, or a DCP folder lacks a rank's shard on every node: a checkpoint is every node's files
        of a save, so nothing is published then."""
        if self.parts is None:
            return []
        folders = sorted({entry for entry in chosen if any(rel.startswith(entry + "/") for rel in snapshot)})
        if not folders:
            return []
        if not final:  # a node that lists nothing of a folder may not have looked yet: ask, and wait for the answers
            wanted = (tuple(folders), frozenset(snapshot.items()))
            if self.asked is None or self.asked[0] != wanted:
                self.asked = (wanted, self.parts.ask())
                return None
            if not self.parts.looked(self.asked[1]):
                return None
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

    def _upload(self, snapshot: Files, step: int) -> list[dict[str, Any]] | None:
        """Every file of the snapshot in the step folder, described. None where a file changed while it was read."""
        folder = storage.join(self.uri, step_dir(step))
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
        changed = [] if frozen else [rel for rel in rels if state_of(self.root / rel) != snapshot[rel]]
        if changed:  # rewritten while it was read: what reached the store may mix two versions
            self.voided += 1
            self.log(f"{self.root / changed[0]} changed while it was uploaded ({time.monotonic() - started:.1f}s); "
                     "from now on each snapshot is copied on this node first (the copy takes a moment, the upload "
                     "is then unhurried) and uploaded from the copy")
            return None
        return entries

    def _commit(self, step: int, chosen: list[str], snapshot: Files, entries: list[dict[str, Any]],
                extra: list[Part], changed: set) -> int:
        """Write the manifest of an uploaded snapshot (the other nodes' files copied in first): from now on it is a
        checkpoint. What it changed since the last one is the set where that was not known yet."""
        folder = storage.join(self.uri, step_dir(step))
        entries = entries + self._upload_parts(extra, set(snapshot), folder)
        new = {rel: state for rel, state in snapshot.items() if state != self.published.get(rel)}
        self.set.committed(new, changed, self._verdict(snapshot))
        checkpoint_store.publish(folder, step, entries, world_size=0, kind="snapshot", log=self.log,
                                 extra={"layout": LAYOUT_DIR, "entries": chosen, "script_step": script_step(chosen),
                                        **self.set.fields(), "ranks": self.ranks or None})
        self.published, self.asked = snapshot, None
        if self.parts is not None:
            self.parts.taken(extra, published=folder)
        self.members = self._checkpoint_entries(snapshot)
        self.log(f"published {', '.join(chosen)} from {self.root} as {folder}")
        self._tell(step, script_step(chosen), entries, [state.mtime_ns / 1e9 for state in new.values()])
        try:  # the checkpoint stands; what retention misses now, the next publish's retention removes
            apply_retention(self.uri, self.keep, log=self.log)
        except Exception as exc:
            self.log(f"retention under {self.uri} failed ({exc}); the next publish tries again")
        return step

    def _tell(self, number: int, step: int | None, entries: list[dict[str, Any]], written: list[float]) -> None:
        """The timeline's ``checkpoint`` event, as the Checkpointer's: the script's own step where the save's name
        carries it (a counter is no training step), the save's own span where its files show it (``written``: when
        each new file was last written, by this node's clock; training waited for it, as a stack's saves are
        synchronous), and the time from its last byte to its publish."""
        if self.announce is None:
            return
        last = max(written, default=time.time())
        span = round(max(0.0, last - min(written, default=last)), 3)
        fields: dict[str, Any] = {"step": step} if step is not None else {}
        self.announce("checkpoint", **fields, checkpoint=number, layout="dir", blocked_s=span, save_s=span,
                      bytes=sum(int(e.get("size") or 0) for e in entries),
                      publish_s=round(max(0.0, time.time() - last), 3))

    def poll(self, final: bool = False, succeeded: bool = True) -> int | None:
        """Publish the folder's snapshot once it is one whole save and differs from the last one published (or
        restored). Returns its step, or None. Raises CloudtrainError (or OSError) when the store refuses it.
        ``final``: the workers have exited; ``succeeded``: each ended with 0, on its own. A stop or a failure may
        have cut a save short, so then a save whose set is not known is published only where the next save began."""
        now = time.monotonic()
        files = self._look(now)
        if not self.step_folders and files and _holds_step_folders(self.root):
            # the checkpoints are the step-<N> folders (published one by one): a file beside them (a final export,
            # a log) is part of none, and never a checkpoint of its own
            if final:
                self.unpublished = [f"{self.root / entry} (beside the step-<N> folders, in none of them: not part of "
                                    "a checkpoint; write a final export to CLOUDTRAIN_OUTPUT_DIR)"
                                    for entry in sorted(entry_files(files))]
            return None
        self._read_store()
        if self.parts is not None and any("/" in rel for rel in files):
            if final:  # the other nodes' last word first: their files count in what a folder holds
                self.parts.wait_final()
            self.parts.refresh()
        if not final:
            self.set.learn(files, self._verdict(files))
        chosen, left = self.choose(files, now, final)
        if final:
            self.unpublished = [f"{self.root / entry} ({why})" for entry, why in sorted(left.items())]
        if not chosen:
            return None
        boxes = containers(files)
        snapshot = {rel: state for rel, state in files.items() if entry_of(rel, boxes) in chosen}
        verdict = self._verdict(files)
        changed = save_sets.changed_keys(snapshot, self.published, verdict)
        if not changed:
            return None  # nothing new since the last checkpoint, or only what rides along with one (a log)
        why = self._not_whole(chosen, snapshot, changed, now, final, succeeded)
        if why == UNKNOWN:
            proven = self._proven(files, now)
            if proven is not None:
                return self._publish(*proven, final=final)
            if final:
                line = (f"{UNKNOWN}, and the workers were stopped (or failed) before a next save showed it whole; "
                        "declare checkpoint.files (--checkpoint-file) to publish a save as soon as its files are whole")
                self.unpublished.append(f"{self.root} (not published: {line})")
                self._say_once(f"not published: {', '.join(chosen)}: {line}")
            else:
                self._say_once(f"the first save in {self.root} is published once the next save has begun (which "
                               "shows it was whole) or the workers end; declare checkpoint.files (--checkpoint-file) "
                               "to publish each save the moment its files are whole")
            return None
        if why is not None:
            if final:
                self.unpublished.append(f"{self.root} (not published: {why})")
                self._say_once(f"not published: {why}; a checkpoint is every file a save writes, so the previous "
                               "one stands")
            return None
        return self._publish(chosen, snapshot, changed, final)

    def _proven(self, files: Files, now: float) -> tuple[list[str], Files, set] | None:
        """While the set a save writes is not known: a snapshot of family members each older than its family's
        newest, so proven over (the next save has begun), where nothing written in place changed with them (that
        may be the next save's already). It is a whole save as it is."""
        chosen, _left = self.choose(files, now, final=False, older=True)
        if not chosen:
            return None
        boxes = containers(files)
        snapshot = {rel: state for rel, state in files.items() if entry_of(rel, boxes) in chosen}
        verdict = self._verdict(files)
        written = [rel for rel in save_sets.checkpoint_rels(snapshot, verdict)
                   if self.published.get(rel) != snapshot[rel]]
        if not written or any(not family(entry_of(rel, boxes)) for rel in written):
            return None
        return chosen, snapshot, save_sets.changed_keys(snapshot, self.published, verdict)

    def _publish(self, chosen: list[str], snapshot: Files, changed: set, final: bool) -> int | None:
        """Upload what is not in the store yet and publish: with every other node's files of it."""
        extra = self._other_nodes(chosen, snapshot, final)
        if extra is None:
            return None
        step = self._generation(chosen)
        self.next_step = step + 1  # a void attempt's objects never mix with the next attempt's
        entries = self._upload(snapshot, step)
        if entries is None:
            return None
        return self._commit(step, chosen, snapshot, entries, extra, changed)


UNKNOWN = save_sets.UNKNOWN


def _holds_step_folders(root: Path) -> bool:
    try:
        return any(e.is_dir(follow_symlinks=False) and step_of(e.name, False) is not None for e in os.scandir(root))
    except OSError:
        return False
