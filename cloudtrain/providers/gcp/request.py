"""The CustomJob for a spec, as Vertex REST JSON: pure data, no SDK, no network.

Layout inside the container (the prebuilt PyTorch image, its command replaced by cloudtrain's bootstrap):
    /gcs/<bucket>/<prefix>/     the staged bundle prefix (bootstrap.py, bundle.tar.gz, manifest.json), read through
                                Vertex's Cloud Storage FUSE mount: nothing is downloaded before the bootstrap starts
    /gcs/<bucket>/<path>        each gs:// input, the same way (CLOUDTRAIN_INPUT_<NAME> holds the path)
    /tmp/cloudtrain/            the bootstrap's workdir: unpacked bundle, pip --target, local checkpoints
Worker pool 0 is the primary (one replica), pool 1 the other N-1 nodes: the bootstrap reads CLUSTER_SPEC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cloudtrain import __version__
from cloudtrain.errors import SpecError
from cloudtrain.naming import platform_tags
from cloudtrain.platforms.node_commands import input_env, job_env
from cloudtrain.providers.gcp import PROVIDER
from cloudtrain.providers.gcp.machines import Machine
from cloudtrain.spec.model import JobSpec

PYTHON = "python"
WORKDIR = "/tmp/cloudtrain"
GCS_MOUNT = "/gcs"
PLACEHOLDER_PROJECT = PROVIDER.placeholders["project"]  # what a plan shows while unset
PLACEHOLDER_BUCKET = PROVIDER.placeholders["bucket"]  # what a plan shows while unset
# Labels: how `list` finds cloudtrain's jobs, how a retried submit or resubmission finds the job it already made,
# and what the recovery loop reads back (max_restarts) on a machine that never saw the spec.
MANAGED_LABEL = "cloudtrain-managed"
PLAN_LABEL = "cloudtrain-plan"  # the plan's job id (also the display name): one job per plan
DIGEST_LABEL = "cloudtrain-bundle"
MAX_RESTARTS_LABEL = "cloudtrain-max-restarts"
RESUBMIT_LABEL = "cloudtrain-resubmit-of"


@dataclass(frozen=True)
class Target:
    """Where the job runs and what it may touch: resolved from spec options, then the environment."""

    project: str
    region: str
    bucket: str
    machine: Machine
    image: str

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"


def gcs_path(uri: str) -> str:
    """gs://bucket/key as the container sees it through Vertex's Cloud Storage FUSE mount."""
    return f"{GCS_MOUNT}/{uri[len('gs://'):]}"


def node_environment(spec: JobSpec) -> dict[str, str]:
    env = job_env(spec)
    for name, uri in spec.inputs.items():
        if not uri.startswith("gs://"):
            raise SpecError(f"Vertex mounts inputs from Cloud Storage, not {uri.split('://')[0]}://",
                            field=f"inputs.{name}", remedy="copy the data to a gs:// URI, or read it from your script")
        env[input_env(name)] = gcs_path(uri)
    return env


# Vertex labels: lowercase letters, digits, '_' and '-'; keys start with a letter; both at most 63 characters.
_BAD = re.compile(r"[^a-z0-9_-]")


def label_rule(key: str, value: str) -> tuple[str, str]:
    key = _BAD.sub("_", key.lower())
    if not key[:1].isalpha():
        key = "t" + key
    return key[:63], _BAD.sub("_", value.lower())[:63]


def user_labels(tags: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The spec's tags as Vertex labels, and a note for each that changed."""
    return platform_tags("gcp", tags, label_rule)


def labels(spec: JobSpec, job_id: str, digest: str) -> tuple[dict[str, str], list[str]]:
    user, notes = user_labels(spec.tags)
    ours = {MANAGED_LABEL: "true", "cloudtrain-job": str(spec.name), PLAN_LABEL: job_id,
            DIGEST_LABEL: digest.split(":", 1)[-1][:63], "cloudtrain-version": __version__.replace(".", "-"),
            MAX_RESTARTS_LABEL: str(spec.max_restarts)}
    return {**user, **ours}, notes


def scheduling(spec: JobSpec, strategy: str | None = None, max_wait: int | None = None) -> tuple[dict[str, Any],
                                                                                               list[str]]:
    """Timeout, restarts and capacity. ``strategy``: a Vertex Scheduling.Strategy (the spec's ``spot`` gives SPOT);
    ``max_wait`` applies to FLEX_START only, where Vertex queues the job until the whole capacity is free."""
    notes: list[str] = []
    strategy = strategy or ("SPOT" if spec.spot else None)
    result: dict[str, Any] = {"timeout": f"{spec.max_runtime}s"}
    if spec.nodes > 1:
        # static ranks: a restarted worker cannot rejoin the others, so Vertex restarts them all (from checkpoint)
        result["restartJobOnWorkerRestart"] = True
    if strategy:
        result["strategy"] = strategy
    if strategy == "FLEX_START":
        result["maxWaitDuration"] = f"{max_wait or 0}s"  # 0: wait as long as it takes
    elif spec.max_wait is not None:
        notes.append("gcp: max_wait is not used on Vertex spot jobs (Vertex bounds only the run, with max_runtime)")
    return result, notes


def worker_pool(machine: Machine, replicas: int, image: str, command: list[str], args: list[str],
                env: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"machineType": machine.machine_type}
    if machine.accelerator_type:
        spec |= {"acceleratorType": machine.accelerator_type, "acceleratorCount": machine.accelerator_count}
    return {"machineSpec": spec, "replicaCount": replicas,
            "containerSpec": {"imageUri": image, "command": command, "args": args,
                              "env": [{"name": k, "value": v} for k, v in env.items()]}}


def custom_job(spec: JobSpec, *, job_id: str, target: Target, digest: str, command: list[str], args: list[str],
               output_dir: str, strategy: str | None = None, max_wait: int | None = None
               ) -> tuple[dict[str, Any], list[str]]:
    """The CreateCustomJob request ({parent, customJob}), and notes for the reader of the plan."""
    env = node_environment(spec)
    schedule, notes = scheduling(spec, strategy, max_wait)
    label_map, label_notes = labels(spec, job_id, digest)
    pools = [worker_pool(target.machine, 1, target.image, command, args, env)]
    if spec.nodes > 1:
        pools.append(worker_pool(target.machine, spec.nodes - 1, target.image, command, args, env))
    options = spec.providers.gcp
    job_spec: dict[str, Any] = {"workerPoolSpecs": pools, "scheduling": schedule,
                                "baseOutputDirectory": {"outputUriPrefix": output_dir}}
    if options.service_account:
        job_spec["serviceAccount"] = options.service_account
    if options.network:
        job_spec["network"] = options.network
    job = {"displayName": job_id, "jobSpec": job_spec, "labels": label_map}
    return {"parent": target.parent, "customJob": job}, [*notes, *label_notes]
