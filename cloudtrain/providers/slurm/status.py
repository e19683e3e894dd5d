"""Slurm's job states in cloudtrain's. Pure: the conformance suite checks the table, every state of squeue's man
page included."""

from __future__ import annotations

from cloudtrain import contract
from cloudtrain.job_types import JobState

# state -> (cloudtrain's state, what it means)
STATES: dict[str, tuple[JobState, str]] = {
    "PENDING": (JobState.PENDING, "waiting for nodes"),
    "CONFIGURING": (JobState.PENDING, "nodes are booting"),
    "REQUEUED": (JobState.PENDING, "requeued: it runs again and resumes from its newest checkpoint"),
    "REQUEUE_HOLD": (JobState.PENDING, "requeued and held: `scontrol release` lets it run again"),
    "REQUEUE_FED": (JobState.PENDING, "requeued by the federation"),
    "RESV_DEL_HOLD": (JobState.PENDING, "held: its reservation was deleted"),
    "SPECIAL_EXIT": (JobState.PENDING, "held after a special exit code: `scontrol release` runs it again"),
    "SUSPENDED": (JobState.PENDING, "suspended by Slurm: it resumes where it stopped"),
    "RUNNING": (JobState.RUNNING, "running"),
    "RESIZING": (JobState.RUNNING, "resizing"),
    "SIGNALING": (JobState.RUNNING, "being signalled"),
    "STAGE_OUT": (JobState.RUNNING, "staging out"),
    "STOPPED": (JobState.RUNNING, "stopped by a signal (SIGSTOP): its nodes are still held"),
    "COMPLETING": (JobState.STOPPING, "its nodes are cleaning up"),
    "COMPLETED": (JobState.SUCCEEDED, "completed"),
    "FAILED": (JobState.FAILED, "failed"),
    "TIMEOUT": (JobState.FAILED, "stopped at its time limit (max_runtime): submit again to resume from its newest "
                                 "checkpoint"),
    "NODE_FAIL": (JobState.FAILED, "a node failed"),
    "BOOT_FAIL": (JobState.FAILED, "a node failed to boot"),
    "OUT_OF_MEMORY": (JobState.FAILED, "out of memory (raise providers.slurm.memory)"),
    "DEADLINE": (JobState.FAILED, "its deadline passed"),
    "CANCELLED": (JobState.CANCELLED, "cancelled"),
    "REVOKED": (JobState.CANCELLED, "revoked (run by another cluster of the federation)"),
    "PREEMPTED": (JobState.PREEMPTED, "preempted (without --requeue: max_restarts 0): submit again to resume from "
                                      "its newest checkpoint"),
}


def job_state(native: str, exit_code: str = "0:0") -> tuple[JobState, str]:
    """cloudtrain's state and a one-line explanation, from Slurm's state (``CANCELLED by 0`` reads as CANCELLED)
    and the batch script's exit code (``143:0``: the nodes were asked to stop and took a final checkpoint)."""
    word = native.split()[0].rstrip("+") if native.strip() else "PENDING"
    state, why = STATES.get(word, (JobState.PENDING, word.lower()))
    code = exit_code.split(":", 1)[0]
    if word == "FAILED" and code == str(contract.EXIT_PREEMPTED):
        return JobState.FAILED, ("stopped by SIGTERM (its time limit was near, or scancel --signal): it took a final "
                                 "checkpoint; submit again to resume from it")
    if word == "FAILED" and code not in ("", "0"):
        return state, f"failed (exit code {code}): `cloudtrain logs` shows why"
    return state, why
