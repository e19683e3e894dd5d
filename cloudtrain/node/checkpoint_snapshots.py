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

The ``step-<N>/`` folders cloudtrain's own layout uses are published per folder as before (checkpoint_store.sync_dir).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import struct
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, NamedTuple

from cloudtrain import contract, storage
from cloudtrain.node import checkpoint_store
from cloudtrain.node.checkpoint_manifest import LAYOUT_DIR, is_dir_layout, step_dir, step_of

QUIET = 2.0  # seconds a snapshot must stay unchanged before it is taken for complete (CLOUDTRAIN_CHECKPOINT_QUIET)
LIVE_AFTER = 10  # a file of no known format that changed at this many scans in a row is a log, not a checkpoint
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", ".lock", "~")
_SHARD = re.compile(r"\d+-of-\d+")  # model-00001-of-00004.safetensors: parts of one thing, not a family
_NUMBER = re.compile(r"\d+")
_DCP_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
# files torch.save and its kin write (never empty when whole): an empty one is a save that wrote nothing
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar", ".distcp", ".pkl")


class FileState(NamedTuple):
    size: int
    mtime_ns: int
    ino: int


Files = Dict[str, FileState]  # path relative to the checkpoint folder -> what it was when looked at


def quiet_period(env: dict[str, str] | None = None) -> float:
    value = (env if env is not None else os.environ).get(contract.CHECKPOINT_QUIET)
    try:
        return max(0.0, float(value)) if value else QUIET
    except ValueError:
        return QUIET


# -- looking (never opening anything that is not a regular file) -------------------------------------------------


def _skipped(name: str) -> bool:
    """A file being written under a name of its own, to be renamed when done (safetensors' ``.tmpXXXXXX``, DCP's
    ``.metadata.tmp``): never part of a checkpoint. DCP's ``.metadata`` is the one hidden file a checkpoint has."""
    return name.endswith(_TEMP_SUFFIXES) or (name.startswith(".") and name != ".metadata")


def scan(root: Path, step_folders: bool = True) -> Files:
    """The regular files under ``root``: hidden top-level entries (cloudtrain's markers, editors' and notebooks'
    folders), temp names and anything that is not a regular file (a FIFO, a socket) are left out, and without
    ``step_folders`` the ``step-<N>`` folders cloudtrain's own layout publishes one by one. A symbolic link counts as
    the file it points to if that is a regular file inside ``root`` (Lightning's ``save_last='link'``)."""
    found: Files = {}
    try:
        top = os.path.realpath(root)
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if not d.startswith(".")
                               and (step_folders or step_of(d, False) is None)]
                filenames = [f for f in filenames if not f.startswith(".")]
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                if _skipped(name):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    if os.path.islink(path) and not os.path.realpath(path).startswith(top + os.sep):
                        continue
                    st = os.stat(path)
                except OSError:  # gone between the listing and the look: it is being replaced
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = name if rel_dir == "." else f"{Path(rel_dir).as_posix()}/{name}"
                found[rel] = FileState(st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        return found
    return found


def file_complete(path: Path) -> bool | None:
    """True or False where the file's format says whether it was written to the end (torch's zip format, whose
    central directory comes last; safetensors, whose header declares the length); None where it cannot say."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if head[:4] == b"PK\x03\x04":
                f.seek(0)
                try:
                    with zipfile.ZipFile(f) as archive:  # reads the end record and the central directory only
                        archive.infolist()
                except (zipfile.BadZipFile, OSError, ValueError, EOFError):
                    return False
                return True
            if path.suffix == ".safetensors":
                if len(head) < 8:
                    return False
                (length,) = struct.unpack("<Q", head)
                size = os.fstat(f.fileno()).st_size
                if length > size - 8:
                    return False
                try:
                    header = json.loads(f.read(length))
                    end = max([int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"] or [0])
                except (ValueError, KeyError, TypeError, IndexError):
                    return False
                return size == 8 + length + end
    except OSError:
        return False
    return None


# -- units and families ------------------------------------------------------------------------------------------


def family(name: str) -> tuple[str, tuple[int, ...]] | None:
    """(the name with its numbers blanked, the numbers) for a name that is one of a numbered series; None for a
    name without numbers, or one whose numbers count parts of one whole (``-00001-of-00004``)."""
    numbers = _NUMBER.findall(name)
    if not numbers or _SHARD.search(name):
        return None
    return _NUMBER.sub("#", name), tuple(int(n) for n in numbers)


def entry_of(rel: str, containers: frozenset = frozenset()) -> str:
    """The entry a file belongs to: its top-level name, or one level down inside a container."""
    parts = rel.split("/")
    return "/".join(parts[:2]) if parts[0] in containers and len(parts) > 2 else parts[0]


def containers(files: Files) -> frozenset:
    """Top-level folders that hold nothing but folders of one family (Accelerate's ``checkpoints/checkpoint_<i>/``):
    their members are entries of their own, so the newest is taken as in a family at the top."""
    inside: dict[str, set] = {}
    for rel in files:
        parts = rel.split("/")
        inside.setdefault(parts[0], set()).add(parts[1] if len(parts) > 2 else None)
    found = set()
    for top, children in inside.items():
        families = {(family(child) or ("", ()))[0] for child in children if child is not None}
        if None not in children and len(families) == 1 and "" not in families:
            found.add(top)
    return frozenset(found)


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


def _marker_missing(entry: str, rels: list[str], world_size: int = 0) -> str | None:
    """A folder whose stack writes one file last, without that file: a DCP checkpoint without ``.metadata`` (or,
    where the world size is known, without a shard ``__<rank>_<i>.distcp`` of every rank: on several nodes each
    holds its own ranks' only), an HF Trainer checkpoint without ``trainer_state.json``."""
    inside = {rel[len(entry) + 1:] for rel in rels if rel.startswith(entry + "/")}
    names = {Path(rel).name for rel in rels}
    if any(n.endswith(".distcp") for n in names):
        if ".metadata" not in names:
            return ".metadata"
        ranks = {int(m.group(1)) for m in map(_DCP_SHARD.match, names) if m}
        missing = sorted(set(range(world_size)) - ranks)
        if ranks and missing:
            return f"a shard of rank {missing[0]} (__{missing[0]}_0.distcp: written on another node)"
    if re.fullmatch(r"checkpoint-\d+", Path(entry).name) and inside and "trainer_state.json" not in inside and \
            any(n in inside for n in ("training_args.bin", "optimizer.pt", "scheduler.pt")):
        return "trainer_state.json"
    return None


class Snapshotter:
    """What node 0 runs around the workers for one checkpoint folder: ``poll()`` while they run (from the sync
    thread), ``poll(final=True)`` once they exited. Keeps what it saw between polls in memory (the bootstrap's
    process lives as long as the node); writes nothing into the folder."""

    def __init__(self, root: Path, uri: str, keep: int, quiet: float = QUIET, log: Any = None,
                 world_size: int = 0, step_folders: bool = True) -> None:
        self.root, self.uri, self.keep, self.quiet, self.world_size = root, uri, keep, quiet, world_size
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
        if self.voided and all(_state(self.root / rel) == snapshot[rel] for rel in rels):
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
        missing = _marker_missing(entry, rels, self.world_size)
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
        if self.next_step is None:
            self.next_step = max(checkpoint_store.steps_present(self.uri), default=0) + 1
        step = script_step(names)
        return max(self.next_step, step if step is not None else 0)

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
        changed = [] if frozen else [rel for rel in rels if _state(self.root / rel) != snapshot[rel]]
        if changed:  # rewritten while it was read: what reached the store may mix two versions
            self.voided += 1
            self.log(f"{self.root / changed[0]} changed while it was uploaded ({time.monotonic() - started:.1f}s); "
                     "from now on each snapshot is copied on this node first (the copy takes a moment, the upload "
                     "is then unhurried) and uploaded from the copy")
            return None
        checkpoint_store.publish(folder, step, entries, world_size=0, kind="snapshot", log=self.log,
                            extra={"layout": LAYOUT_DIR, "entries": chosen, "script_step": script_step(chosen)})
        self.published = snapshot
        self.members = self._checkpoint_entries(snapshot)
        self.log(f"published {', '.join(chosen)} from {self.root} as {folder}")
        try:  # the checkpoint stands; what retention misses now, the next publish's retention removes
            checkpoint_store.apply_retention(self.uri, self.keep, log=self.log)
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


def _state(path: Path) -> FileState | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileState(st.st_size, st.st_mtime_ns, st.st_ino)
