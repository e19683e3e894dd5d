"""Azure ML job statuses in cloudtrain's states. Azure has no "preempted" status: a job whose nodes were
pre-empted ends Failed with a PreemptionError, and is NOT restarted by the service; cloudtrain recognises it from
the run's error so its recovery can resubmit it."""

from __future__ import annotations

from cloudtrain.job_types import JobState

_PENDING = {"NotStarted", "Starting", "Provisioning", "Preparing", "Queued"}
_RUNNING = {"Running", "Finalizing"}
# Every job status of Azure ML's REST API (its JobStatus enum; tests/test_azure.py holds them equal): the conformance
# suite maps each.
NATIVE_STATES = ("NotStarted", "Starting", "Provisioning", "Preparing", "Queued", "Running", "Finalizing",
                 "CancelRequested", "Completed", "Failed", "Canceled", "NotResponding", "Paused", "Unknown")


def is_preemption(error: str) -> bool:
    text = error.lower()
    return "preemption" in text or "pre-empted" in text or "preempted" in text


def job_state(status: str, error: str = "") -> tuple[JobState, str]:
    if status in _PENDING:
        return JobState.PENDING, status
    if status in _RUNNING:
        return JobState.RUNNING, status
    if status == "CancelRequested":
        return JobState.STOPPING, "cancel requested"
    if status == "Completed":
        return JobState.SUCCEEDED, "completed"
    if status == "Canceled":
        return JobState.CANCELLED, "canceled"
    if status == "Failed":
        if is_preemption(error):
            return JobState.PREEMPTED, "nodes were pre-empted; Azure ML does not restart the job: cloudtrain's " \
                                       "recovery resubmits it (max_restarts), resuming from its newest checkpoint"
        return JobState.FAILED, f"failed: {error}" if error else "failed"
    return JobState.PENDING, status  # NotResponding, Paused, Unknown: not an end
