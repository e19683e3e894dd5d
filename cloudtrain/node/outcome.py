"""How a node's run ends, once torchrun has exited: its outcome (succeeded, failed, preempted or stopped), the status
the bootstrap records, the last lines its log shows, and its exit code. Standard library only, Python 3.8
(the node entry, cloudtrain/node/entry.py, runs it from the bundle's lib/)."""

from __future__ import annotations

import time
from typing import Any, Callable

from cloudtrain.contract import EXIT_FAILED, EXIT_PREEMPTED


def _log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def conclude(status: dict[str, object], code: int, stopped: bool, watch: Any, cluster: Any, gpus: int,
             started: float, report: Callable[[str], None],
             write: Callable[[dict[str, object]], str | None]) -> int:
    """Decide the node's outcome, record it (``write``: the status file; returns why it could not, or None), tell
    the platform of a failure (``report``) and say it in the log's last lines; returns the node's exit code.
    ``watch``: the node watch (None: unwatched)."""
    # torchrun exits 1 after forwarding SIGTERM even when every worker saved and exited cleanly: a stop we were
    # asked for is "preempted", whatever its exit code; one the node decided on (supervisor gone, idle) failed it.
    # A job whose checkpoints did not reach the store has not succeeded (status["error"] says where they are); a
    # preempted one restarts from the last published. A stop that was no preemption (a peer failed, a cancel,
    # max_runtime) is "stopped", where whoever stopped the node said why (the local supervisor does).
    stopped_by = None
    if watch and watch.reason:
        outcome = "failed"
    elif stopped:
        stopped_by = watch.stopped_by() if watch else None
        outcome = "stopped" if stopped_by else "preempted"
    else:
        outcome = "succeeded" if code == 0 and "error" not in status else "failed"
    found = watch.findings(outcome, gpus) if watch else {}
    outcome = found.pop("outcome", outcome)  # require_process_group: processes that each trained alone failed it
    status.update(outcome=outcome, returncode=code, ended=time.time(), **found)
    if stopped_by:
        status["reason"] = f"stopped: {stopped_by}"
    if outcome == "failed":
        why = status.get("reason") or status.get("error") or (
            f"torchrun exited {code}; the node's log (and its workers' logs in the job's outputs) says why")
        report(f"cloudtrain: node {cluster.node_rank} of {cluster.nnodes} failed: {why}")
    problem = write(status)
    if problem:  # a disk that filled up (cloudtrain/node/node_files.py): the node fails, and says why
        if outcome != "failed":
            report(f"cloudtrain: node {cluster.node_rank} of {cluster.nnodes} failed: {problem}")
        outcome, stopped_by = "failed", None
        status.update(outcome=outcome, reason=problem)
    for key in ("error", "reason", "note", "hint"):  # why it failed, or why its success is hollow: the last lines read
        if status.get(key) and not (key == "reason" and stopped_by):
            _log(f"node {cluster.node_rank}: {status[key]}")
    took = watch.took(time.time() - started) if watch else f"{time.time() - started:.1f}s"
    _log(f"node {cluster.node_rank} {outcome}{f': {stopped_by}' if stopped_by else ''} (torchrun exit {code}) "
         f"after {took}")
    return {"succeeded": 0, "preempted": EXIT_PREEMPTED, "stopped": EXIT_PREEMPTED}.get(outcome, EXIT_FAILED)


def warned_message(nodes: list[dict[str, Any]]) -> str:
    """The first thing a node warned of at its end (checkpoints not published, nothing restored, files a restart
    loses: its status file's ``warnings``), so a job that succeeded with them never reads a plain "succeeded"; ''
    where none did. Nodes as ``{"rank": N, "warnings": [...]}``."""
    warned = [f"node {n.get('rank')}: {line}" for n in nodes for line in n.get("warnings") or []
              if isinstance(line, str)]
    more = f" (and {len(warned) - 1} more warning(s))" if len(warned) > 1 else ""
    return f"{warned[0]}{more}" if warned else ""
