"""How a local job ended, judged from its nodes: by the supervisor as its nodes exit, and by ``status`` from the
nodes' own status files when the supervisor was lost before it could record the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudtrain import safe_json
from cloudtrain.node.durations import format_duration
from cloudtrain.node.outcome import warned_message
from cloudtrain.node.rank_report import alone_text

# Why the supervisor stopped the nodes; a node that saw our SIGTERM reports "preempted" (the first of these) or
# "stopped" (the supervisor said why: the others).
PREEMPT, CANCEL, MAX_RUNTIME, PEER_FAILED = "preempted", "cancelled", "max_runtime", "peer_failed"
_STOPPED_AS = {PREEMPT: "preempted", CANCEL: "cancelled", MAX_RUNTIME: "stopped", PEER_FAILED: "stopped"}
# what a node's status file adds to its record (warnings: checkpoint files not published, files a restart loses;
# set_aside: the checkpoint its failed start had restored, set aside so a restart takes an older one)
NODE_FIELDS = ("reason", "error", "note", "hint", "ranks", "warnings", "cause", "set_aside")


def read_status(path: str | Path | None) -> dict[str, Any] | None:
    """A node's status file (written by its bootstrap when it ends), or None if it never wrote one."""
    if not path:
        return None
    try:
        status = safe_json.load(path)  # a FIFO in its place, or one nested 100,000 deep: as if none was written
    except (OSError, ValueError):  # ValueError: safe_json.UnreadableJson
        return None
    return status if isinstance(status, dict) and isinstance(status.get("outcome"), str) else None


def settle_node(node: dict[str, Any], stop: str | None) -> None:
    """Fill ``outcome`` (and the status file's reason, note, hint, rank reports) for a node that exited."""
    status = read_status(node.get("status_file"))
    if status is not None:
        outcome = status["outcome"]
        node.update({k: status[k] for k in NODE_FIELDS if status.get(k)})
        node["ended"] = status.get("ended")
    elif node.get("exit_code") == 0:
        outcome = "succeeded"
    else:  # it died before it could say: judge by what was done to it
        outcome = "preempted" if stop else "failed"
    node["outcome"] = _STOPPED_AS.get(stop or "", outcome) if outcome in ("preempted", "stopped") else outcome


def final_state(nodes: list[dict[str, Any]], *, cancelled: bool, stop: str | None, attempt: int,
                max_runtime: float | None = None, ran_for: float | None = None) -> tuple[str, str]:
    """(state, message) for a job whose nodes all ended."""
    if cancelled:
        return "cancelled", "cancelled by user"
    if stop == MAX_RUNTIME and max_runtime:
        return "failed", f"max_runtime {format_duration(max_runtime)} exceeded: stopped after " \
                         f"{format_duration(ran_for or max_runtime)}"
    failed = [n for n in nodes if n.get("outcome") == "failed"]
    if failed:  # the one that failed first: the others may have failed because it did (connection closed by peer)
        first = min(failed, key=lambda n: n.get("ended") or float("inf"))
        reason = first.get("reason") or first.get("error")  # error: the bootstrap's own (checkpoints, bundle)
        code = f" with exit code {first['exit_code']}" if first.get("exit_code") is not None else ""
        return "failed", f"node {first['rank']} failed{code}" + (f": {reason}" if reason else " (see its log)")
    if any(n.get("outcome") == "preempted" for n in nodes):
        return "preempted", f"preempted (SIGTERM) after {attempt} restart(s)"
    return "succeeded", "; ".join(filter(None, [hollow_message(nodes), warned_message(nodes)]))


def hollow_message(nodes: list[dict[str, Any]]) -> str:
    """'4 processes ran, none joined a process group: each trained alone' (plus a node's hint), or ''."""
    reports = [n["ranks"] for n in nodes if isinstance(n.get("ranks"), dict)]
    if not reports:
        return ""
    total = {k: sum(r.get(k, 0) for r in reports) for k in ("ran", "no_group", "group_of_one", "silent")}
    text = alone_text({**total, "world_size": max(r.get("world_size", 0) for r in reports)})
    hint = next((f"node {n['rank']}: {n['hint']}" for n in nodes if n.get("hint")), None)
    return f"{text}; {hint}" if text and hint else text or ""
