"""The CreateTrainingJob request for a spec: pure data, no boto3, no network.

Layout inside the container (the prebuilt PyTorch image, its own entrypoint replaced by cloudtrain's bootstrap):
    /opt/ml/input/data/cloudtrain/   the staged bundle prefix (bootstrap.py, bundle.tar.gz, manifest.json), a channel
    /opt/ml/input/data/<name>/       each of the spec's inputs, a channel
    /opt/ml/cloudtrain/              the bootstrap's workdir: unpacked bundle, pip --target, local checkpoints
Checkpoints go to ``checkpoint.uri`` through cloudtrain's own protocol (manifest last, retention that never deletes
the newest). SageMaker's CheckpointConfig is left unset on purpose: it would upload the same files a second time and
mirror local deletes (the Checkpointer prunes its local copies) into the bucket.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from cloudtrain import __version__
from cloudtrain.errors import SpecError
from cloudtrain.naming import platform_tags
from cloudtrain.platforms.node_commands import input_env, job_env
from cloudtrain.providers.aws import PROVIDER
from cloudtrain.spec.model import JobSpec

CHANNEL = "cloudtrain"
CHANNEL_DIR = f"/opt/ml/input/data/{CHANNEL}"
WORKDIR = "/opt/ml/cloudtrain"
PYTHON = "python3"
MAX_SECONDS = 28 * 24 * 3600  # SageMaker's ceiling for MaxRuntimeInSeconds and MaxWaitTimeInSeconds
PLACEHOLDER_ROLE = PROVIDER.placeholders["role"]  # what a plan shows while unset
PLACEHOLDER_BUCKET = PROVIDER.placeholders["bucket"]  # what a plan shows while unset
MANAGED_TAG = "cloudtrain:managed"  # how `list` finds cloudtrain's jobs among all of an account's
DIGEST_TAG = "cloudtrain:bundle"  # how a retried submit recognises the job it already created


@dataclass(frozen=True)
class Target:
    """Where the job runs and what it may touch: resolved from spec options, then the environment."""

    region: str
    role: str
    bucket: str
    instance_type: str
    image: str


def channel(name: str, s3_uri: str) -> dict[str, Any]:
    return {"ChannelName": name, "InputMode": "File",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": s3_uri,
                                            "S3DataDistributionType": "FullyReplicated"}}}


def input_channels(spec: JobSpec) -> list[dict[str, Any]]:
    channels = []
    for name, uri in spec.inputs.items():
        if name == CHANNEL:
            raise SpecError(f"the input name {CHANNEL!r} is reserved for cloudtrain's bundle", field=f"inputs.{name}",
                            remedy="rename that input")
        if not uri.startswith("s3://"):
            raise SpecError(f"SageMaker reads inputs from S3, not {uri.split('://')[0]}://", field=f"inputs.{name}",
                            remedy="copy the data to an s3:// URI, or read it from your script")
        channels.append(channel(name, uri))
    return channels


def stopping_condition(spec: JobSpec) -> tuple[dict[str, int], list[str]]:
    notes = []
    runtime = spec.max_runtime
    if runtime > MAX_SECONDS:
        raise SpecError(f"{runtime}s is beyond SageMaker's limit of 28 days", field="max_runtime",
                        remedy=f"use at most {MAX_SECONDS} ('28d')")
    condition = {"MaxRuntimeInSeconds": runtime}
    if spec.spot:
        wait = spec.max_wait or min(MAX_SECONDS, 2 * runtime)
        if wait > MAX_SECONDS:
            raise SpecError(f"{wait}s is beyond SageMaker's limit of 28 days", field="max_wait",
                            remedy=f"use at most {MAX_SECONDS} ('28d')")
        if spec.max_wait is None:
            why = "twice max_runtime" if wait == 2 * runtime else "SageMaker's 28-day limit"
            notes.append(f"aws: spot max_wait defaults to {wait}s ({why}): time waiting for capacity "
                         "plus running, across interruptions")
        condition["MaxWaitTimeInSeconds"] = wait
    return condition, notes


# SageMaker tags: keys 1-128, values 0-256 characters of Unicode letters, digits, separators (not tabs or newlines)
# and _.:/=+-@ ; the prefix 'aws:' is reserved.
_AWS_EXTRA = set("_.:/=+-@")


def _clean(text: str) -> str:
    return "".join(ch if ch in _AWS_EXTRA or unicodedata.category(ch)[0] in "LNZ" else "_" for ch in text)


def tag_rule(key: str, value: str) -> tuple[str, str]:
    if key.lower().startswith("aws:"):
        raise SpecError(f"tag {key!r} uses the prefix 'aws:', which AWS reserves", field=f"tags.{key}",
                        remedy="choose another key")
    return _clean(key)[:128] or "_", _clean(value)[:256]


def user_tags(tags: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The spec's tags as SageMaker accepts them, and a note for each that changed."""
    return platform_tags("aws", tags, tag_rule)


def tags(spec: JobSpec, digest: str) -> tuple[list[dict[str, str]], list[str]]:
    user, notes = user_tags(spec.tags)
    ours = {MANAGED_TAG: "true", "cloudtrain:job": str(spec.name), DIGEST_TAG: digest,
            "cloudtrain:version": __version__}
    return [{"Key": k, "Value": v} for k, v in {**user, **ours}.items()], notes


def node_environment(spec: JobSpec) -> dict[str, str]:
    env = job_env(spec)
    for name in spec.inputs:
        env[input_env(name)] = f"/opt/ml/input/data/{name}"  # SageMaker downloads each channel there
    return env


def create_training_job(spec: JobSpec, *, job_name: str, target: Target, bundle_prefix: str, digest: str,
                        container_args: list[str], output_path: str) -> tuple[dict[str, Any], list[str]]:
    """The request, and notes for the reader of the plan."""
    condition, notes = stopping_condition(spec)
    tag_list, tag_notes = tags(spec, digest)
    notes += tag_notes
    options = spec.providers.aws
    request: dict[str, Any] = {
        "TrainingJobName": job_name,
        "RoleArn": target.role,
        "AlgorithmSpecification": {
            "TrainingImage": target.image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": [PYTHON, f"{CHANNEL_DIR}/bootstrap.py"],
            "ContainerArguments": container_args,
        },
        "InputDataConfig": [channel(CHANNEL, bundle_prefix.rstrip("/") + "/"), *input_channels(spec)],
        "OutputDataConfig": {"S3OutputPath": output_path},
        "ResourceConfig": {"InstanceType": target.instance_type, "InstanceCount": spec.nodes,
                           "VolumeSizeInGB": options.volume_size_gb},
        "StoppingCondition": condition,
        "EnableManagedSpotTraining": spec.spot,
        "Environment": node_environment(spec),
        "Tags": tag_list,
    }
    if options.subnets or options.security_group_ids:
        if not (options.subnets and options.security_group_ids):
            raise SpecError("a VPC needs both subnets and security groups", field="providers.aws.subnets",
                            remedy="set providers.aws.subnets and providers.aws.security_group_ids together")
        request["VpcConfig"] = {"Subnets": options.subnets, "SecurityGroupIds": options.security_group_ids}
    if spec.max_restarts:
        # SageMaker restarts spot interruptions by itself (within MaxWaitTime); RetryStrategy covers the rest
        request["RetryStrategy"] = {"MaximumRetryAttempts": min(spec.max_restarts, 30)}
    return request, notes
