"""cloudtrain's own files in a source folder, which the package leaves out: a spec file, a saved plan (or the
beginning of one still being written), and the file this very command's output goes to.

A saved plan in the project must not ship: packaged, it would change the bundle's digest, so the plan would be
refused as stale the moment it was written. But only a plan is one: a file is taken for a plan when it parses as
one, or when it is a plan's beginning (a plan being written, or cut short). An empty file is neither: it ships like
any other, and counts toward package.max_files. A plan saved through `plan -o json | tee plan.json` is empty while
it is being planned; it is known as the file the process reading this command's output writes (found in /proc, on
Linux).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from cloudtrain.regular_files import open_regular

# A cloudtrain spec file: cloudtrain.yaml, or YAML with script/module and one more of the spec's top-level keys. Never
# packaged: a node gets every setting through the provider request and its environment, and a copy would carry env
# values in clear.
SPEC_FILE_NAMES = ("cloudtrain.yaml", "cloudtrain.yml")
_SPEC_KEYS = ("nodes|procs_per_node|providers|checkpoint|strategy|accelerator|env|args|source_dir|requirements|spot"
              "|max_runtime|image|inputs|output_uri|package")
_SPEC_FILE = re.compile(rf"^(?:script|module):.*^(?:{_SPEC_KEYS}):|^(?:{_SPEC_KEYS}):.*^(?:script|module):",
                        re.MULTILINE | re.DOTALL)
_SPEC_PROBE_BYTES = 256 * 1024
_PLAN_PROBE_BYTES = 256
SPEC_FILE_WHY = "a cloudtrain spec file or saved plan: nodes get its settings through the request"
PLAN_BEGUN_WHY = "the beginning of a saved plan (one being written, or cut short): nodes get its settings through " \
                 "the request"
OUTPUT_WHY = "the file this command's output goes to (`plan -o json > plan.json`, or `| tee plan.json`)"

# How a saved plan begins, piece by piece (a piece ending in * or + is a pattern, any other is literal text):
# `plan -o json` (provider, job_id), `plan -p aws,gcp -o json` (its legs, each with provider, region and plan) and
# `plan -o yaml`.
_JSON_STARTS = (
    ("{", r"\s*", '"provider":', r"\s*", '"', '[^"]*', '",', r"\s*", '"job_id":', r"\s*", '"'),
    ("{", r"\s*", '"legs":', r"\s*", "[", r"\s*", "{", r"\s*", '"provider":', r"\s*", '"', '[^"]*', '",', r"\s*",
     '"region":'),
)
_YAML_STARTS = (("provider: ", r"\S+", "\njob_id: ", r"\S+", "\ncreated_at: "),)
# A plan is kilobytes (its file list grows with the source); a larger file is not one (as saved.MAX_BYTES)
_PLAN_MAX_BYTES = 64 * 1024 * 1024
_SEAL = "seal"  # plan.seal.SEAL (a room above this one): every saved plan carries its parts' digests there


def _piece(piece: str) -> str:
    return piece if piece.endswith(("*", "+")) else re.escape(piece)


def _beginnings(pieces: tuple[str, ...]) -> str:
    """A regex whose full match is any beginning of a text the pieces match (the empty one included)."""
    if not pieces:
        return ""
    first, rest = pieces[0], _beginnings(pieces[1:])
    if first.endswith("*"):
        return f"{first}{rest}"
    if first.endswith("+"):
        return f"(?:{first}{rest})?"
    nested = rest
    for char in reversed(first):  # "ab" then rest: "", "a", "ab", "ab" + a beginning of the rest
        nested = f"(?:{re.escape(char)}{nested})?"
    return nested


def _starts(starts: tuple[tuple[str, ...], ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(a plan's start, searched; a beginning of it, fully matched) for these ways a plan begins."""
    whole = "|".join("".join(_piece(p) for p in pieces) for pieces in starts)
    begun = "|".join(_beginnings(pieces) for pieces in starts)
    return re.compile(f"^(?:{whole})"), re.compile(f"(?:{begun})", re.DOTALL)


_JSON_PLAN, _JSON_PLAN_BEGUN = _starts(_JSON_STARTS)
_YAML_PLAN, _YAML_PLAN_BEGUN = _starts(_YAML_STARTS)


def own_file_why(path: Path) -> str | None:
    """Why ``path`` is cloudtrain's own and not source (a spec file, a saved plan, a plan's beginning); None for
    source."""
    if path.name.lower() in SPEC_FILE_NAMES:
        return SPEC_FILE_WHY
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        return None
    try:
        with open_regular(path) as f:  # never a FIFO named data.yaml: opening it would wait for a writer
            head = f.read(_SPEC_PROBE_BYTES if suffix != ".json" else _PLAN_PROBE_BYTES).decode("utf-8", "replace")
    except OSError:  # unreadable, not a regular file or a dangling link: judged where it is read
        return None
    if suffix == ".json":
        return _json_plan_why(path, head)
    if _SPEC_FILE.search(head) or _YAML_PLAN.search(head):
        return SPEC_FILE_WHY
    return PLAN_BEGUN_WHY if head.strip() and _YAML_PLAN_BEGUN.fullmatch(head) else None


def is_spec_file(path: Path) -> bool:
    """A YAML file that is a cloudtrain job spec (cloudtrain.yaml, or any file given to -f), or a plan saved for
    `submit --plan` (or its beginning)."""
    return own_file_why(path) is not None


def _json_plan_why(path: Path, head: str) -> str | None:
    if not _JSON_PLAN.search(head):  # a beginning shorter than the start (empty is no plan: it ships)
        return PLAN_BEGUN_WHY if head.strip() and _JSON_PLAN_BEGUN.fullmatch(head) else None
    try:  # begins as a plan: one only if it parses as one (a config may start with provider and job_id)
        with open_regular(path) as f:
            raw = f.read(_PLAN_MAX_BYTES + 1)
        if len(raw) > _PLAN_MAX_BYTES:
            return None
        data = json.loads(raw.decode("utf-8"))
    except OSError:
        return None
    except (ValueError, RecursionError):  # not whole yet: a plan being written, or cut short
        return PLAN_BEGUN_WHY
    return SPEC_FILE_WHY if isinstance(data, dict) and isinstance(data.get(_SEAL), dict) else None


def output_files() -> set[tuple[int, int]]:
    """(device, inode) of each regular file this command's standard output is being written to: `plan -o json >
    plan.json` in the project creates the (empty) file before the plan is made, and `plan -o json | tee plan.json`
    has tee create it; neither must be packaged."""
    try:
        st = os.fstat(1)
    except OSError:
        return set()
    if stat.S_ISREG(st.st_mode):
        return {(st.st_dev, st.st_ino)}
    return _piped_to((st.st_dev, st.st_ino)) if stat.S_ISFIFO(st.st_mode) else set()


def _piped_to(pipe: tuple[int, int]) -> set[tuple[int, int]]:
    """The regular files open for writing in the processes of this session that read the pipe ``pipe`` (a tee).
    Linux only (/proc); elsewhere none are found."""
    try:
        session, pids = os.getsid(0), [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return set()
    found: set[tuple[int, int]] = set()
    for pid in pids:
        if pid != os.getpid() and _session(pid) == session and _fds(pid, pipe):
            found |= {(st.st_dev, st.st_ino) for st in _fds(pid)}
    return found


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return int(fields[3])  # state, ppid, pgrp, session
    except (OSError, IndexError, ValueError):
        return None


def _fds(pid: int, pipe: tuple[int, int] | None = None) -> list[os.stat_result]:
    """With ``pipe``: the pid's descriptors that read that pipe; else its regular files open for writing."""
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's
        return []
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        access = flags & os.O_ACCMODE
        reads_pipe = stat.S_ISFIFO(st.st_mode) and (st.st_dev, st.st_ino) == pipe and access == os.O_RDONLY
        writes_file = stat.S_ISREG(st.st_mode) and access in (os.O_WRONLY, os.O_RDWR)
        if reads_pipe if pipe is not None else writes_file:
            found.append(st)
    return found
