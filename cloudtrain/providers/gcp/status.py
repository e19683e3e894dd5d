"""Vertex job states in cloudtrain's states, and the details a user checks. Pure: tested on every state."""

from __future__ import annotations

import re
from typing import Any

from cloudtrain import contract
from cloudtrain.job_types import JobState
from cloudtrain.providers.gcp import request as rq

# How Vertex words a job that ended because its spot VMs were reclaimed (and were not brought back).
_PREEMPTED = re.compile(r"preempt|spot (vm|capacity).*(reclaim|stop)|reclaimed", re.IGNORECASE)

_STATES = {
    "JOB_STATE_QUEUED": (JobState.PENDING, "queued"),
    "JOB_STATE_PENDING": (JobState.PENDING, "provisioning"),
    "JOB_STATE_RUNNING": (JobState.RUNNING, "running"),
    "JOB_STATE_SUCCEEDED": (JobState.SUCCEEDED, "succeeded"),
    "JOB_STATE_PARTIALLY_SUCCEEDED": (JobState.FAILED, "partially succeeded"),
    "JOB_STATE_FAILED": (JobState.FAILED, "failed"),
    "JOB_STATE_CANCELLING": (JobState.STOPPING, "cancelling"),
    "JOB_STATE_CANCELLED": (JobState.CANCELLED, "cancelled"),
    "JOB_STATE_PAUSED": (JobState.PENDING, "paused"),
    "JOB_STATE_EXPIRED": (JobState.FAILED, "expired (max_runtime)"),
    "JOB_STATE_UPDATING": (JobState.RUNNING, "updating"),
    "JOB_STATE_UNSPECIFIED": (JobState.PENDING, "state not given yet"),
}
# Every state of Vertex's JobState enum (tests/test_gcp.py holds them equal): the conformance suite maps each.
NATIVE_STATES = tuple(_STATES)


def job_state(state: str, error: str = "", started: bool = False) -> tuple[JobState, str]:
    """cloudtrain's state and a one-line explanation. ``started``: the job ran before (it has a start time)."""
    if state == "JOB_STATE_FAILED" and _PREEMPTED.search(error or ""):
        return JobState.PREEMPTED, "spot capacity was reclaimed and the job ended; resubmit (cloudtrain wait " \
                                   "--recover) to resume from the newest checkpoint"
    if state in ("JOB_STATE_PENDING", "JOB_STATE_QUEUED") and started:
        return JobState.PENDING, "restarting: Vertex restarts the job after a worker restart or spot " \
                                 "preemption; it resumes from its newest checkpoint"
    found, message = _STATES.get(state, (JobState.PENDING, state or "unknown"))
    return found, f"{message}: {error}" if error and found in (JobState.FAILED, JobState.CANCELLED) else message


def since_key(state: str) -> str:
    """The CustomJob field that says when it entered ``state``: ``endTime`` for an end, ``startTime`` for running
    (when it first ran: after a restart that is before the state seen between, and the timeline does not take it),
    else ``updateTime`` (the job's newest change, which its move to this state is)."""
    if state == "JOB_STATE_RUNNING":
        return "startTime"
    return "endTime" if state in _ENDED else "updateTime"


_ENDED = {"JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
          "JOB_STATE_EXPIRED"}


def describe_details(job: dict[str, Any]) -> dict[str, Any]:
    """The parts of a CustomJob (REST JSON) a user checks: machines, capacity, limits, where things went."""
    spec = job.get("jobSpec") or {}
    pools = spec.get("workerPoolSpecs") or []
    machine = (pools[0].get("machineSpec") or {}) if pools else {}
    labels = job.get("labels") or {}
    scheduling = spec.get("scheduling") or {}
    details: dict[str, Any] = {
        "vertex_state": job.get("state"),
        "resource_name": job.get("name"),
        "machine_type": machine.get("machineType"),
        "accelerator": f"{machine['acceleratorType']}:{machine.get('acceleratorCount', 1)}"
        if machine.get("acceleratorType") else None,
        "node_count": sum(int(p.get("replicaCount") or 0) for p in pools),
        "spot": scheduling.get("strategy") == "SPOT",
        "strategy": scheduling.get("strategy") or "STANDARD",
        "max_restarts": int(labels.get(rq.MAX_RESTARTS_LABEL) or 0),
    }
    if labels.get(rq.RESUBMIT_LABEL):
        details["resubmission_of"] = labels[rq.RESUBMIT_LABEL]
    if (job.get("error") or {}).get("message"):
        details["error"] = job["error"]["message"]
    output = (spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if output:
        details["output_uri"] = output
    env = {e.get("name"): e.get("value") for e in ((pools[0].get("containerSpec") or {}).get("env") or [])} \
        if pools else {}
    if env.get(contract.CHECKPOINT_URI):  # where a restart resumes from, and where its chain's state is kept
        details["checkpoint_uri"] = env[contract.CHECKPOINT_URI]
    return details
