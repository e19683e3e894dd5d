"""What a checkpoint folder's files are, looked at without trusting them (stdlib only, Python 3.8): which files a
folder holds (regular files only, temp names left out), whether a file's format says it was written to the end
(torch's zip, safetensors), and whether a folder lacks the file its stack writes last (DCP's ``.metadata``, the HF
Trainer's ``trainer_state.json``). Node 0's snapshots (checkpoint_snapshots) and the other nodes' parts
(checkpoint_parts) judge files by these same rules."""

from __future__ import annotations

import os
import re
import stat
import struct
import zipfile
from pathlib import Path
from typing import Dict, Iterable, NamedTuple

from cloudtrain import safe_json
from cloudtrain.checkpoint.manifest import step_of

_SHARD = re.compile(r"\d+-of-\d+")  # model-00001-of-00004.safetensors: parts of one thing, not a family
_NUMBER = re.compile(r"\d+")
_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)  # model_rank_1.pt, mp_rank_00_model_states.pt
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", ".lock", "~")
_DCP_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
# files torch.save and its kin write (never empty when whole): an empty one is a save that wrote nothing
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar", ".distcp", ".pkl")


class FileState(NamedTuple):
    size: int
    mtime_ns: int
    ino: int


Files = Dict[str, FileState]  # path relative to the checkpoint folder -> what it was when looked at


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
                if length > safe_json.MAX_BYTES:  # not read to judge it (safetensors' own limit is 100 MB)
                    return None
                try:  # a header nested 100,000 deep is a file cut or garbled, never a RecursionError
                    header = safe_json.loads(f.read(length), str(path))
                    end = max([int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"] or [0])
                except (ValueError, KeyError, TypeError, IndexError):
                    return False
                return size == 8 + length + end
    except OSError:
        return False
    return None


def marker_missing(entry: str, rels: list[str], world_size: int = 0) -> str | None:
    """A folder whose stack writes one file last, without that file: a DCP checkpoint without ``.metadata`` (or,
    where the world size is known, without a shard ``__<rank>_<i>.distcp`` of every rank: on several nodes each
    holds its own ranks' only), an HF Trainer checkpoint without ``trainer_state.json``."""
    inside = {rel[len(entry) + 1:] for rel in rels if rel.startswith(entry + "/")}
    names = {Path(rel).name for rel in rels}
    if any(n.endswith(".distcp") for n in names):
        if ".metadata" not in names:
            return ".metadata"
        missing = dcp_ranks_missing(names, world_size)
        if missing:
            return f"rank {missing[0]}'s shard (__{missing[0]}_0.distcp)"
    if re.fullmatch(r"checkpoint-\d+", Path(entry).name) and inside and "trainer_state.json" not in inside and \
            any(n in inside for n in ("training_args.bin", "optimizer.pt", "scheduler.pt")):
        return "trainer_state.json"
    return None


def state_of(path: Path) -> FileState | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileState(st.st_size, st.st_mtime_ns, st.st_ino)


def dcp_ranks_missing(names: Iterable[str], world_size: int) -> list[int]:
    """The ranks of a DCP checkpoint (its files' names) without a shard ``__<rank>_<i>.distcp``, where the world
    size is known; none where it is not, or where the folder holds no shard at all."""
    ranks = {int(m.group(1)) for m in map(_DCP_SHARD.match, (Path(n).name for n in names)) if m}
    return sorted(set(range(world_size)) - ranks) if ranks else []


def broken(root: Path, rels: Iterable[str]) -> str | None:
    """Why one of these files cannot be part of a checkpoint as it is (a save that wrote nothing; one whose format
    says it was cut short), or None."""
    for rel in sorted(rels):
        path = root / rel
        try:
            size = os.stat(path).st_size
        except OSError:
            return f"{rel} is gone (being replaced?)"
        if size == 0 and rel.endswith(CHECKPOINT_SUFFIXES):
            return f"{rel} is empty (a save that wrote nothing, or was cut off at its start)"
        if file_complete(path) is False:
            return f"{rel} is incomplete (being written, or cut short)"
    return None


# -- names: entries and families ----------------------------------------------------------------------------------


def family(name: str) -> tuple[str, tuple[int, ...]] | None:
    """(the name with its numbers blanked, the numbers) for a name that is one of a numbered series; None for a
    name without numbers, or one whose numbers count parts of one whole (``-00001-of-00004``, a DCP shard
    ``__<rank>_<i>.distcp``). A rank's number (``model_rank_1.pt``, ``mp_rank_00_model_states.pt``) is part of the
    name, not a generation: each rank's file of a save is taken, never only the highest rank's."""
    if _SHARD.search(name) or _DCP_SHARD.match(name):
        return None
    ranks = {m.span(1) for m in _RANK.finditer(name)}
    numbers = [m for m in _NUMBER.finditer(name) if m.span() not in ranks]
    if not numbers:
        return None
    blanked, last = [], 0
    for m in numbers:
        blanked += [name[last:m.start()], "#"]
        last = m.end()
    return "".join(blanked) + name[last:], tuple(int(m.group(0)) for m in numbers)


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


def working_files(src: Path) -> set[str]:
    """The files in the script's working folder (the unpacked source), by relative path: what a script writes there
    beside its checkpoint folder is told apart from what was there before it ran."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, src)
        found.update(name if rel == "." else os.path.join(rel, name) for name in filenames)
    return found


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


def entry_files(files: Files) -> dict[str, Files]:
    boxes = containers(files)
    found: dict[str, Files] = {}
    for rel, state in files.items():
        found.setdefault(entry_of(rel, boxes), {})[rel] = state
    return found


def marked_done(entry: str, rels: list[str]) -> bool:
    """A folder its stack marks as done with a file written last (DCP's ``.metadata``, the HF Trainer's
    ``trainer_state.json``)."""
    names = {rel[len(entry) + 1:] for rel in rels}
    return ".metadata" in names or (bool(re.fullmatch(r"checkpoint-\d+", Path(entry).name))
                                    and "trainer_state.json" in names)
