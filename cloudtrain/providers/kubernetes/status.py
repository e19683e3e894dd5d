"""A TrainJob's or PyTorchJob's state in cloudtrain's, from its conditions, what cloudtrain marked on it, and what
happened to its pods. Pure: the conformance suite checks the table. Everything the status shows beyond the state
(``JobStatus`` fields) is put together here, in ``status_fields`` only.

TrainJob (kubeflow/trainer v2.3.0): conditions Suspended, Complete, Failed (reason DeadlineExceeded at
activeDeadlineSeconds); running is read from ``status.jobsStatus`` (the JobSet's child Jobs). PyTorchJob (Training
Operator v1): conditions Created, Running, Restarting, Succeeded, Failed, Suspended; the newest true one decides.

Preempted: a job that failed after one of its pods was disrupted (the pod's DisruptionTarget condition: the
scheduler preempted it, the node was drained or lost) or stopped with 143 (the node took a final checkpoint after
SIGTERM) once its restarts were used up. A job Kueue evicts is suspended and requeued, so it is pending again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from cloudtrain import contract
from cloudtrain.job_types import JobState
from cloudtrain.providers.kubernetes.request import ANNOTATION


class Native(NamedTuple):
    """What decides a job's state: its kind, its deciding condition (type, reason), and two facts cloudtrain finds."""

    kind: str  # TrainJob | PyTorchJob
    condition: str  # the deciding true condition's type ("" none yet)
    reason: str = ""
    cancelled: bool = False  # cloudtrain's cancel marked it (and suspended it)
    disrupted: bool = False  # a pod was disrupted or stopped by SIGTERM (143)
    active: bool = False  # TrainJob: a child Job has ready pods


def job_state(native: Native) -> tuple[JobState, str]:
    _kind, condition, reason, cancelled, disrupted, active = native
    if condition in ("Complete", "Succeeded"):
        return JobState.SUCCEEDED, "completed"
    if condition == "Failed":
        if reason == "DeadlineExceeded":
            return JobState.FAILED, ("stopped at max_runtime (activeDeadlineSeconds): submit again to resume from its "
                                     "newest checkpoint")
        if disrupted:
            return JobState.PREEMPTED, ("preempted: a node was taken away (or asked to stop) and the job's restarts "
                                        "are used up; `cloudtrain wait --recover HANDLE` resubmits it to resume "
                                        "from its newest checkpoint")
        return JobState.FAILED, f"failed ({reason or 'no reason given'}): `cloudtrain logs` shows why"
    if cancelled:
        return (JobState.CANCELLED, "cancelled (suspended; `kubectl delete` removes it)") if condition == "Suspended" \
            else (JobState.STOPPING, "cancelling: its pods are being stopped")
    if condition == "Suspended":
        why = "evicted by Kueue (preempted): it runs again from its newest checkpoint when readmitted" \
            if disrupted else "suspended: waiting for Kueue to admit it (or for `suspend: false`)"
        return JobState.PENDING, why
    if condition == "Restarting":
        return JobState.PENDING, "restarting its pods: it resumes from its newest checkpoint"
    if condition == "Running" or active:
        return JobState.RUNNING, "running"
    return JobState.PENDING, "created: waiting for its pods to start" if condition else "submitted"


def _true(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in conditions if c.get("status") == "True"]


def native_of(obj: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> Native:
    status = obj.get("status") or {}
    conditions = _true(status.get("conditions") or [])
    kind = obj.get("kind", "TrainJob")
    order = ("Failed", "Complete", "Succeeded", "Suspended")
    deciding = next((c for name in order for c in conditions if c.get("type") == name), None)
    if deciding is None and conditions:  # PyTorchJob: the newest true condition (Created, Running, Restarting)
        deciding = max(conditions, key=lambda c: c.get("lastTransitionTime") or "")
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    active = any((j.get("ready") or 0) + (j.get("active") or 0) > 0 for j in status.get("jobsStatus") or [])
    return Native(kind, (deciding or {}).get("type", ""), (deciding or {}).get("reason", ""),
                  annotations.get(ANNOTATION + "cancelled") == "true", disrupted(pods or []) or
                  annotations.get(ANNOTATION + "evicted") == "true", active)


def since_text(obj: dict[str, Any], native: Native, state: JobState) -> str | None:
    """When the job entered ``state``, as the cluster says it: the ``lastTransitionTime`` of the condition that gives
    the state (Suspended, Running, Restarting, Complete, Failed ...); None where no condition gives it (a TrainJob runs
    by its child Jobs, a cancel not yet suspended, a job with no condition yet)."""
    if not native.condition or (state is JobState.RUNNING and native.condition != "Running") or \
            state is JobState.STOPPING:
        return None
    found = [c for c in _true((obj.get("status") or {}).get("conditions") or []) if c.get("type") == native.condition]
    when = found[-1].get("lastTransitionTime") if found else None
    return when if isinstance(when, str) else None


def disrupted(pods: list[dict[str, Any]]) -> bool:
    """A pod the cluster took away (DisruptionTarget: preemption, drain, node loss) or that ended preempted (143)."""
    for pod in pods:
        status = pod.get("status") or {}
        if any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in status.get("conditions")
               or []):
            return True
        for cs in status.get("containerStatuses") or []:
            ended = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            if ended.get("exitCode") == contract.EXIT_PREEMPTED:
                return True
    return False


def status_fields(obj: dict[str, Any], native: Native, context: str | None) -> dict[str, Any]:
    """A job's ``JobStatus`` fields beyond state and times (the typed ones the core reads, and ``details``): the
    one place this provider fills them."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    trainer = status.get("trainerStatus") or {}
    details = {"kind": native.kind, "namespace": meta.get("namespace"), "context": context,
               "condition": native.condition, "reason": native.reason, "uid": meta.get("uid"),
               "jobs": status.get("jobsStatus"), "progress": trainer.get("progressPercentage"),
               "eta_seconds": trainer.get("estimatedRemainingSeconds")}
    return {"details": details, "output_uri": annotations.get(ANNOTATION + "output-uri"),
            "checkpoint_uri": annotations.get(ANNOTATION + "checkpoint-uri"),
            "max_restarts": int(annotations.get(ANNOTATION + "max-restarts") or 0)}


# native -> cloudtrain's state: the conformance suite's table (tests/test_conformance.py)
# Every condition that can decide a job's state, per kind (TrainJob: none yet, or one of its conditions; PyTorchJob:
# the Training Operator's): the conformance suite finds each in TABLE.
_CONDITIONS = {"TrainJob": ("", "Suspended", "Complete", "Failed"),
               "PyTorchJob": ("Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended")}
NATIVE_STATES = tuple(Native(kind, condition) for kind, conditions in _CONDITIONS.items() for condition in conditions)
TABLE: list[tuple[Native, JobState]] = [
    (Native("TrainJob", ""), JobState.PENDING),
    (Native("TrainJob", "Suspended", "Suspended"), JobState.PENDING),
    (Native("TrainJob", "Suspended", "Suspended", disrupted=True), JobState.PENDING),
    (Native("TrainJob", "", active=True), JobState.RUNNING),
    (Native("TrainJob", "", cancelled=True, active=True), JobState.STOPPING),
    (Native("TrainJob", "Suspended", "Suspended", cancelled=True), JobState.CANCELLED),
    (Native("TrainJob", "Complete", "JobSetCompleted"), JobState.SUCCEEDED),
    (Native("TrainJob", "Failed", "JobSetFailed"), JobState.FAILED),
    (Native("TrainJob", "Failed", "DeadlineExceeded"), JobState.FAILED),
    (Native("TrainJob", "Failed", "JobSetFailed", disrupted=True), JobState.PREEMPTED),
    (Native("PyTorchJob", "Created", "PyTorchJobCreated"), JobState.PENDING),
    (Native("PyTorchJob", "Running", "PyTorchJobRunning"), JobState.RUNNING),
    (Native("PyTorchJob", "Restarting", "PyTorchJobRestarting"), JobState.PENDING),
    (Native("PyTorchJob", "Succeeded", "PyTorchJobSucceeded"), JobState.SUCCEEDED),
    (Native("PyTorchJob", "Failed", "PyTorchJobFailed"), JobState.FAILED),
    (Native("PyTorchJob", "Suspended", "PyTorchJobSuspended", cancelled=True), JobState.CANCELLED),
    (Native("PyTorchJob", "Failed", "PyTorchJobFailed", disrupted=True), JobState.PREEMPTED),
]
