"""SageMaker's (status, secondary status) pairs in cloudtrain's states. Pure: tested on every pair."""

from __future__ import annotations

from typing import Any

from cloudtrain import contract
from cloudtrain.job_types import JobState

_STARTING = {"Starting", "Pending", "LaunchingMLInstances", "PreparingTrainingStack", "Downloading",
             "DownloadingTrainingImage"}
# Managed spot: "Interrupted" then "Restarting" while SageMaker waits for capacity and starts the job again on new
# instances (within MaxWaitTimeInSeconds). Not an end: the job resumes from checkpoint.uri.
_SPOT_WAIT = {"Interrupted", "Restarting"}
# Every (TrainingJobStatus, SecondaryStatus) pair SageMaker reports, both vocabularies in full as botocore's model has
# them (tests/test_aws.py holds them equal): the conformance suite maps each.
NATIVE_STATES: tuple[tuple[str, str], ...] = (
    *(("InProgress", s) for s in ("Starting", "Pending", "LaunchingMLInstances", "PreparingTrainingStack",
                                  "Downloading", "DownloadingTrainingImage", "Training", "Uploading", "Updating",
                                  "Interrupted", "Restarting")),
    ("Stopping", "Stopping"), ("Completed", "Completed"), ("Failed", "Failed"), ("Stopped", "Stopped"),
    ("Stopped", "MaxRuntimeExceeded"), ("Stopped", "MaxWaitTimeExceeded"), ("Deleting", ""),
)


def job_state(primary: str, secondary: str | None) -> tuple[JobState, str]:
    """cloudtrain's state and a one-line explanation."""
    secondary = secondary or ""
    if primary == "InProgress":
        if secondary in _SPOT_WAIT:
            return JobState.PENDING, "spot capacity was reclaimed; SageMaker restarts the job, which resumes " \
                                     "from its newest checkpoint"
        if secondary in _STARTING or not secondary:
            return JobState.PENDING, secondary or "starting"
        return JobState.RUNNING, secondary
    if primary == "Completed":
        return JobState.SUCCEEDED, "completed"
    if primary == "Failed":
        return JobState.FAILED, "failed"
    if primary == "Stopping":
        return JobState.STOPPING, "stopping"
    if primary == "Deleting":  # DeleteTrainingJob on an ended job: its record (and how it ended) goes with it
        return JobState.CANCELLED, "being deleted on SageMaker (DeleteTrainingJob)"
    if primary == "Stopped":
        if secondary == "MaxWaitTimeExceeded":
            return JobState.PREEMPTED, "spot capacity did not come back within max_wait; resubmit to resume " \
                                       "from the newest checkpoint"
        if secondary == "MaxRuntimeExceeded":
            return JobState.FAILED, "stopped by max_runtime"
        return JobState.CANCELLED, "stopped"
    return JobState.PENDING, f"{primary}/{secondary}"


def describe_details(job: dict[str, Any]) -> dict[str, Any]:
    """The parts of DescribeTrainingJob a user checks: spot savings, interruptions, where things went."""
    transitions = job.get("SecondaryStatusTransitions") or []
    details: dict[str, Any] = {
        "sagemaker_status": job.get("TrainingJobStatus"),
        "secondary_status": job.get("SecondaryStatus"),
        "instance_type": (job.get("ResourceConfig") or {}).get("InstanceType"),
        "instance_count": (job.get("ResourceConfig") or {}).get("InstanceCount"),
        "spot": bool(job.get("EnableManagedSpotTraining")),
        "spot_interruptions": sum(1 for t in transitions if t.get("Status") == "Interrupted"),
        "output_uri": (job.get("Environment") or {}).get(contract.OUTPUT_URI)
        or (job.get("OutputDataConfig") or {}).get("S3OutputPath"),
    }
    if (job.get("Environment") or {}).get(contract.CHECKPOINT_URI):
        details["checkpoint_uri"] = job["Environment"][contract.CHECKPOINT_URI]
    for key, name in (("TrainingTimeInSeconds", "training_seconds"), ("BillableTimeInSeconds", "billable_seconds"),
                      ("FailureReason", "failure_reason"), ("TrainingJobArn", "arn")):
        if job.get(key) is not None:
            details[name] = job[key]
    if details["spot"] and job.get("TrainingTimeInSeconds") and job.get("BillableTimeInSeconds") is not None:
        details["spot_savings"] = round(1 - job["BillableTimeInSeconds"] / job["TrainingTimeInSeconds"], 3)
    return details
