"""A job's timeline: an append-only list of timed events, from two sources.

- The client (and the local provider's supervisor, which is the local platform) appends its own to a per-job file
  in the home, ``<home>/events/<handle>.jsonl``: submitted, staged, the platform's states as status sees them,
  node starts, preemptions, restarts, the end. One ``write`` per line on a file opened for appending, so lines from
  two processes never mix.
- The nodes print theirs into their logs (cloudtrain/node/events.py); ``read`` picks them out of the logs the
  provider already serves (``Provider.logs``), so every provider carries them with no channel of its own.

A line cut short (a node killed mid-write, a full disk) is skipped and counted as missing, never an error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from cloudtrain.home import event_schema
from cloudtrain.home.paths import cloudtrain_home
from cloudtrain.node.events import PREFIX, parse
from cloudtrain.node.worker_echo import ROLE

_warned: set[str] = set()


def path(handle: str) -> Path:
    return cloudtrain_home() / "events" / (re.sub(r"[^A-Za-z0-9._-]+", "_", handle) + ".jsonl")


def record(job: str, kind: str, when: float | None = None, **fields: Any) -> None:
    """Append one event to ``handle``'s timeline. Best effort: the job runs either way; a home that cannot be
    written loses the timeline only (said once)."""
    event = {"e": kind, "t": round(time.time() if when is None else when, 3), **fields}
    if not _append(path(job), [event]) and job not in _warned:
        _warned.add(job)
        print(f"cloudtrain: warning: cannot write the timeline of {job} under {path(job).parent}: "
              "`status` shows less of its story", file=sys.stderr)


def _append(file: Path, events: list[dict[str, Any]]) -> bool:
    data = "".join(json.dumps(e, separators=(",", ":"), default=str) + "\n" for e in events).encode()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def own_events(handle: str) -> tuple[list[dict[str, Any]], int]:
    """The client's events of ``handle`` and how many lines of its file could not be read."""
    try:
        text = path(handle).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], 0
    except OSError:
        return [], 1
    found, missing = [], 0
    for text_line in text.splitlines():
        if not text_line.strip():
            continue
        try:
            event = json.loads(text_line)
        except (ValueError, RecursionError):
            missing += 1
            continue
        if isinstance(event, dict) and isinstance(event.get("e"), str) and isinstance(event.get("t"), (int, float)) \
                and not isinstance(event["t"], bool):
            found.append(event)
        else:
            missing += 1
    return found, missing


def node_events(lines: Any) -> tuple[list[dict[str, Any]], int]:
    """The events in log lines (``[node1] ... cloudtrain-event {...}``), each tagged with the node the line names
    (local and Slurm: its rank; elsewhere the platform's name for it, ``workerpool0-0``) and with who printed it
    (``by``: "worker" where a worker's ``[default<r>]:`` prefix stands before the event, else "node": a worker's
    output always carries it, cloudtrain/node/worker_echo.py); and how many were cut short. All parsed as one JSON
    document where none is cut short (a job's logs may hold 10,000 of them: status stays quick), line by line
    otherwise."""
    parts: list[str] = []
    tags: list[tuple[int | str | None, str]] = []
    for text_line in lines:
        at = text_line.find(PREFIX)
        if at < 0:
            continue
        parts.append(text_line[at + len(PREFIX):])
        tag = _NODE.match(text_line) if text_line.startswith("[") else None  # [node1], [node 1], [node-1], [algo-1]
        node = None if tag is None or _WORKER.match(text_line) else int(tag.group(2)) if tag.group(2) else tag.group(1)
        tags.append((node, "worker" if _WORKER.search(text_line, 0, at) else "node"))
    try:
        parsed: list[Any] = json.loads("[" + ",".join(parts) + "]")
    except (ValueError, RecursionError):
        parsed = []
    if len(parsed) != len(parts):
        parsed = [_parsed(part) for part in parts]
    found, missing = [], 0
    for event, (node, by) in zip(parsed, tags, strict=True):
        if not isinstance(event, dict) or not isinstance(event.get("e"), str) or \
                not isinstance(event.get("t"), (int, float)) or isinstance(event["t"], bool):
            missing += 1
            continue
        event["by"] = by  # what the line says of itself is not taken
        if node is not None:
            event["node"] = node
        elif by == "worker":
            event.pop("node", None)
        found.append(event)
    return found, missing


def _parsed(part: str) -> Any:
    try:
        return parse(PREFIX + part)
    except RecursionError:  # a line of 100,000 brackets: garbled, like any other
        return {}


_NODE = re.compile(r"\[(node[ -]?(\d+)|[^\]\s]+)\]")
_WORKER = re.compile(re.escape(f"[{ROLE}") + r"\d+\]:")


def read(provider: Any, handle: Any) -> dict[str, Any]:
    """Everything known of a job's timeline: ``{"events": [...] by time, "missing": n, "logs": why or None,
    "ignored": {"count": n, "kinds": {...}}}``: every event screened (cloudtrain/home/event_schema.py), those that
    fail counted in ``ignored``. Logs that cannot be fetched now (a platform that keeps them elsewhere, a transient
    error) leave the client's events, and say why."""
    events, missing = own_events(str(handle))
    why = None
    try:
        found, cut = node_events(provider.logs(handle, follow=False))
    except Exception as exc:
        found, cut, why = [], 0, f"the nodes' events are not known: their logs could not be read ({exc})"
    kept, ignored = event_schema.screen(events, found)
    return {"events": kept, "missing": missing + cut, "logs": why, "ignored": ignored}


def own_only(handle: Any, why: str) -> dict[str, Any]:
    """A timeline of the home's own events only (the nodes' logs cannot be read from here), screened as ``read``'s."""
    events, missing = own_events(str(handle))
    kept, ignored = event_schema.screen(events, [])
    return {"events": kept, "missing": missing, "logs": why, "ignored": ignored}


def empty_folder(events: list[dict[str, Any]]) -> str | None:
    """What node 0 said of a checkpoint folder the script never writes (a typo'd checkpoint.dir), if it did
    (``checkpoint_dir_empty``: cloudtrain/checkpoint/sync.py)."""
    said = next((e.get("text") for e in reversed(events) if e["e"] == "checkpoint_dir_empty"), None)
    return said[:1000] if isinstance(said, str) else None


def observe(status: Any) -> None:
    """Record what a status call saw that the timeline does not have yet: a new platform state, more restarts, the
    end. Compared with the last one seen (``<events file>.seen``), so repeated polls add nothing."""
    handle = str(status.handle)
    seen_file = path(handle).with_suffix(".seen")
    platform = platform_state(status.details)
    now = f"{status.state.value}|{status.restarts or 0}|{json.dumps(platform, sort_keys=True)}|{status.message[:200]}"
    try:
        before = seen_file.read_text(encoding="utf-8")
    except OSError:
        before = ""
    if before == now:
        return
    was_state, was_restarts = ([*before.split("|"), "", "0"])[:2]
    was_restarts = was_restarts if was_restarts.isdigit() else "0"
    recorded, _ = own_events(handle)  # read once: what the home has, for the times below
    events: list[dict[str, Any]] = []
    stamp = round(time.time(), 3)
    if (status.restarts or 0) > int(was_restarts or 0):
        # when the restart happened, where this home knows it (the local supervisor's start of that attempt), else
        # when it was seen
        began = next((e["t"] for e in reversed(recorded)
                      if e["e"] == "node_started" and e.get("attempt") == status.restarts), None)
        events.append({"e": "restarted", "t": began if began is not None else stamp, "restarts": status.restarts,
                       **({} if began is not None else {"seen": True})})
    if status.state.value != was_state or (not status.state.terminal and before.split("|")[2:3] != now.split("|")[2:3]):
        # an end at the platform's own end time where it gives one (a client that looks an hour later does not
        # make the job an hour longer), never before what the home has (a platform's whole seconds); a state change
        # at the platform's own time for it (``state_since``) where it gives a sane one that is not before what the
        # home has (Vertex's first start after a restart is not this change's), else when it was seen, the
        # platform's move to running being placed by its nodes' own first events (cloudtrain/home/goodput.py)
        newest = max((float(e["t"]) for e in [*recorded, *events] if math.isfinite(e["t"]) and e["t"] <= stamp),
                     default=None)
        ended_at = status.ended_at if status.state.terminal and _sane(status.ended_at, stamp) else None
        told: Any = getattr(status, "state_since", None)
        since = round(min(float(told), stamp), 3) if not status.state.terminal and _sane(told, stamp) else None
        since = None if since is None or (newest is not None and since < newest) else since
        at = round(max(float(ended_at), newest or 0.0), 3) if ended_at is not None else since
        events.append({"e": "ended" if status.state.terminal else "state", "t": stamp if at is None else at,
                       "state": status.state.value,
                       "message": status.message[:200], **({"platform": platform} if platform else {}),
                       **({"ended_at": ended_at, "seen_at": stamp} if ended_at is not None else {}),
                       **({"seen_at": stamp} if since is not None else {})})
    if events and not _append(path(handle), events):
        return
    with contextlib.suppress(OSError):
        seen_file.write_text(now, encoding="utf-8")


def _sane(when: Any, now: float) -> bool:
    """A platform's time that can be taken as it is: a number, not in the future, not before 2020."""
    return isinstance(when, (int, float)) and not isinstance(when, bool) and 1.5e9 < when <= now + event_schema.SKEW_S


def platform_state(details: dict[str, Any]) -> dict[str, str]:
    """The platform's own words for where a job is (SageMaker's secondary status Starting/Downloading/Training/
    Interrupted, Vertex's JOB_STATE_QUEUED, Slurm's PENDING (Resources), a Kubernetes condition and reason): a new
    one is a new state event, even where cloudtrain's state (pending, running) stays the same."""
    return {k: v for k, v in details.items() if isinstance(v, str) and len(v) < 200 and (
        k.endswith(("_state", "_status")) or k in ("condition", "reason"))}


def known_handles() -> list[str]:
    """Every job this home has a timeline for (``status -o openmetrics`` without a handle), newest first."""
    from cloudtrain.home.errors import os_problem

    folder = cloudtrain_home() / "events"
    try:
        files = sorted((folder / n for n in os.listdir(folder) if n.endswith(".jsonl")),
                       key=lambda p: p.stat().st_mtime, reverse=True)
    except FileNotFoundError:
        return []
    except OSError as exc:  # a home of another shape, or one this user cannot read: the user's to fix
        raise os_problem(exc, folder, "read the jobs' timelines") from None
    handles = []
    for file in files:
        try:  # the submitted event names it: among the first lines (the supervisor may have written before it)
            with open(file, encoding="utf-8", errors="replace") as f:
                head = [f.readline() for _ in range(20)]
        except OSError:
            continue
        for text_line in head:
            try:
                event = json.loads(text_line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("handle"), str):
                handles.append(event["handle"])
                break
    return handles
