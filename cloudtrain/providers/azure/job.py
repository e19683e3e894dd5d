"""The Azure ML command job for a spec, as the YAML ``az ml job create`` / ``load_job`` accepts. Pure data.

Process layout: ``PyTorchDistribution(process_count_per_instance=1)``. The service then starts ONE process per node,
cloudtrain's bootstrap, with MASTER_ADDR, MASTER_PORT and NODE_RANK set; the bootstrap restores the newest checkpoint
and runs torchrun with one worker per GPU and static ranks, as on every other platform. Letting Azure start one
process per GPU instead would skip the bootstrap (no restore before the workers start, no SIGTERM handling, no
uniform preemption outcome) and make WORLD_SIZE mean processes rather than nodes.
"""

from __future__ import annotations

import shlex
from typing import Any

from cloudtrain import contract
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME
from cloudtrain.errors import SpecError
from cloudtrain.platforms import catalog, images
from cloudtrain.platforms.images import Runtime
from cloudtrain.platforms.node_commands import input_env, job_env
from cloudtrain.spec.model import JobSpec

SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
CODE_DIR = "./code"  # relative to the job YAML, as `az ml job create -f` resolves it
WORKDIR = "/tmp/cloudtrain"  # on the node's disk; the code snapshot folder is the command's working directory
# Azure ML's "job lifetime" limits (Manage quotas, Azure Machine Learning compute): 21 days, 7 on low-priority (spot)
# nodes; checked at plan time so a longer max_runtime is refused here rather than by the service.
MAX_RUNTIME = 21 * 24 * 3600
MAX_RUNTIME_SPOT = 7 * 24 * 3600
MANAGED_TAG = "cloudtrain.managed"
DIGEST_TAG = "cloudtrain.bundle"
RESTARTS_TAG = "cloudtrain.max_restarts"
RESTART_OF_TAG = "cloudtrain.restart_of"
# the spec field behind each field of the job (the longest matching path wins), for messages about a job Azure ML
# would reject
SPEC_FIELDS = {
    "name": "name", "display_name": "name", "description": "name", "experiment_name": "providers.azure.experiment",
    "command": "args", "environment": "providers.azure.environment", "environment_variables": "env",
    "resources": "accelerator", "resources.instance_count": "nodes", "resources.instance_type":
    "providers.azure.instance_type", "limits": "max_runtime", "tags": "tags", "inputs": "inputs",
    "compute": "providers.azure.compute", "queue_settings": "spot"}


def environment(spec: JobSpec) -> tuple[Runtime, list[str]]:
    """The job's environment: the spec's own, or an Azure Container for PyTorch (ACPT) curated environment from the
    shared "azureml" registry at a version whose torch and Python are known (its ``labels/latest`` moves)."""
    options = spec.providers.azure
    if options.environment:
        ref = options.environment if options.environment.startswith("azureml:") else f"azureml:{options.environment}"
        return Runtime(image=ref, torch=None, python=None, pinned=False,
                       source="providers.azure.environment (your workspace's environment)"), []
    if spec.image.uri:
        return images.custom(spec.image.uri), []
    table = images.table("azure")
    version, notes = images.choose_minor("azure", list(table["environments"]), spec)
    entry = table["environments"][version]
    what = f"the Azure ML environment {entry['name']} version {entry['version']}"
    notes += images.python_for("azure", entry["python"], spec, what)
    if entry.get("retired"):
        notes.append(f"azure: {entry['name']}: {entry['retired']}")
    ref = f"azureml://registries/azureml/environments/{entry['name']}/versions/{entry['version']}"
    return Runtime(image=ref, torch=entry["torch"], python=entry["python"], pinned="patch_unknown" not in entry,
                   source=f"azureml-assets release {entry['name']}/{entry['version']} ({entry['published']})"), notes


def inputs(spec: JobSpec) -> dict[str, dict[str, str]]:
    found = {}
    for name, uri in spec.inputs.items():
        scheme = uri.split("://", 1)[0]
        if scheme not in ("abfs", "abfss", "azureml", "https", "wasbs"):
            raise SpecError(f"Azure ML reads inputs from Azure storage, not {scheme}://", field=f"inputs.{name}",
                            remedy="use abfss://container@account.dfs.core.windows.net/path or an azureml:// URI")
        kind = "uri_folder" if uri.endswith("/") or "." not in uri.rsplit("/", 1)[-1] else "uri_file"
        found[name] = {"type": kind, "path": uri}
    return found


def without_local_checkpoints(spec: JobSpec) -> tuple[JobSpec, list[str]]:
    """A ``file://`` checkpoint URI is on this computer, which no Azure node reaches (and Azure has no bucket option
    to derive a default from, unlike S3 and GCS): the job is sent, and planned, without one, loudly."""
    uri = spec.checkpoint.uri
    if not uri or not uri.startswith("file://"):
        return spec, []
    note = (f"azure: CHECKPOINTS OFF: checkpoint.uri {uri} is on this computer, which the nodes cannot reach, so "
            "the job is sent without one; set checkpoint.uri to az://ACCOUNT/CONTAINER/PATH to resume after "
            "preemption")
    return spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"uri": None})}), [note]


def command_job(spec: JobSpec, *, job_name: str, digest: str,
                bootstrap: list[str]) -> tuple[dict[str, Any], Runtime, list[str]]:
    """The job YAML as a dict, the runtime its nodes run, and notes for the plan's reader. ``bootstrap``: the
    bootstrap's arguments. ``code`` names the folder beside the YAML that holds what a node needs (bootstrap.py,
    bundle.tar.gz, manifest.json): `submit` and `plan --export` write it; the plan itself writes nothing."""
    options = spec.providers.azure
    limit = MAX_RUNTIME_SPOT if spec.spot else MAX_RUNTIME
    if spec.max_runtime > limit:
        raise SpecError(f"{spec.max_runtime}s is beyond Azure ML's job lifetime of {limit // 86400} days"
                        + (" on spot (low-priority) nodes" if spec.spot else ""), field="max_runtime",
                        remedy=f"use at most {limit // 86400}d and let the job resume from its checkpoints")
    runtime, notes = environment(spec)
    inline = spec.image.uri and not options.environment  # an image, not an environment asset: inline environment
    env_ref: str | dict[str, str] = {"image": runtime.image} if inline else runtime.image
    job_inputs = inputs(spec)
    # inputs resolve only on the command line (${{inputs.x}}); the bootstrap exports them to the workers
    exports = [f"--env={input_env(name)}=${{{{inputs.{name}}}}}" for name in job_inputs]
    args = bootstrap[:bootstrap.index("--")] + exports + bootstrap[bootstrap.index("--"):]
    command = shlex.join(["python", BOOTSTRAP_NAME, *args])
    resources: dict[str, Any] = {"instance_count": spec.nodes}
    job: dict[str, Any] = {
        "$schema": SCHEMA,
        "type": "command",
        "name": job_name,
        "display_name": spec.name,
        "experiment_name": options.experiment or spec.name,
        "description": f"cloudtrain job {spec.name} ({digest})",
        "code": CODE_DIR,
        "command": command,
        "environment": env_ref,
        "environment_variables": {**job_env(spec), contract.NNODES: str(spec.nodes)},
        "distribution": {"type": "pytorch", "process_count_per_instance": 1},
        "resources": resources,
        "limits": {"timeout": spec.max_runtime},
        "tags": {**spec.tags, MANAGED_TAG: "true", DIGEST_TAG: digest, RESTARTS_TAG: str(spec.max_restarts)},
    }
    if job_inputs:
        job["inputs"] = job_inputs
    if options.compute:
        job["compute"] = f"azureml:{options.compute}"
        if spec.spot:
            notes.append(f"azure: spot comes from the cluster {options.compute!r}: create it with tier "
                         "'low_priority' (queue settings apply to serverless compute only)")
    else:  # serverless compute: Azure ML provisions the VMs for this job
        resources["instance_type"] = catalog.instance_for("azure", spec.accelerator_model, spec.gpus_per_node,
                                                          options.instance_type)
        if spec.spot:
            job["queue_settings"] = {"job_tier": "spot"}
    if not spec.output_uri:
        notes.append("azure: outputs go to the job's ./outputs (CLOUDTRAIN_OUTPUT_DIR, node logs included), which "
                     "Azure ML uploads to the workspace's default datastore: `az ml job download --name "
                     f"{job_name} --all` fetches them (or set output_uri to an az:// location)")
    if spec.spot:
        if spec.max_restarts:
            notes.append("azure: Azure ML does not restart a preempted job; cloudtrain resubmits it (up to "
                         f"{spec.max_restarts} time(s)) while `submit` follows it or `wait --recover` watches")
        else:
            notes.append("azure: Azure ML does not restart a preempted job, and with max_restarts 0 nothing "
                         "resubmits it: a preempted job ends preempted; set max_restarts (--max-restarts 3) for "
                         "cloudtrain to resubmit it while `submit` follows it or `wait --recover` watches")
        if not spec.checkpoint.uri:  # no bucket option on Azure to derive one from, unlike S3 and GCS
            notes.append("azure: spot without checkpoint.uri: a preempted job starts over; set checkpoint.uri "
                         "(az://ACCOUNT/CONTAINER/PATH) so it resumes")
    return job, runtime, notes
