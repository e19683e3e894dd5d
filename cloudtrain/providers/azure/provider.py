"""Azure Machine Learning command jobs: plan offline (checked against a snapshot of azure-ai-ml's job schema, without
importing the SDK), submit through MLClient (the job loaded by the SDK's own ``load_job`` first; code uploaded to the
workspace's datastore, skipped when the same content is there), follow the run's user logs, cancel, list, and
resubmit preempted jobs (Azure ML never restarts them)."""

from __future__ import annotations

import builtins
import io
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import yaml

from cloudtrain import contract
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
from cloudtrain.bundle.staging import STAGED, new_job_id
from cloudtrain.errors import HandleError, SpecError, TransientError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import Capability, JobStatus, Summary, where
from cloudtrain.platforms import catalog
from cloudtrain.platforms.node_commands import bootstrap_args
from cloudtrain.providers.azure import PROVIDER, rest, schema
from cloudtrain.providers.azure import job as aj
from cloudtrain.providers.azure.status import job_state
from cloudtrain.providers.azure.workspace import CAPACITY, azure_errors, ml_client, workspace_of
from cloudtrain.providers.base import Provider
from cloudtrain.providers.translation import PlanContext, Planned, Translation

# azure-ai-ml logs "experimental field/class" for queue_settings (spot) on every plan; cloudtrain chose the field
# knowingly, and a plan's stderr should hold what the user must act on
for _name in ("azure.ai.ml._utils._experimental", "azure.ai.ml._schema.core.fields"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def load_validated(job: dict[str, Any], code: str) -> Any:
    """azure-ai-ml's own ``load_job`` on the YAML text, exactly as ``az ml job create -f`` reads it, with ``code``
    (an existing file or folder: the schema checks it exists) in place of the job's own, and nothing written."""
    from azure.ai.ml import load_job

    text = yaml.safe_dump({**job, "code": code}, sort_keys=False)
    try:
        return load_job(io.StringIO(text), relative_origin=os.path.dirname(os.path.abspath(code)))
    except Exception as exc:  # marshmallow's ValidationError: the schema's own words
        raise SpecError(f"Azure ML rejects the job: {str(exc).strip()[:1500]}", field="providers.azure",
                        remedy="fix the spec fields behind the job fields named above") from None


def plan_summary(plan: Planned) -> Summary:
    """The plan summary's Azure ML lines: the workspace and compute; a cluster's VM size is the cluster's."""
    return Summary(where=where(("workspace", plan.staging.get("workspace")), ("compute", plan.staging.get("compute"))),
                   instance="the compute cluster's VM size")


class AzureMLProvider(Provider):
    declaration = PROVIDER
    capabilities = frozenset({Capability.MULTI_NODE, Capability.SPOT, Capability.ACCELERATORS, Capability.RESUBMIT})
    capacity_patterns = (CAPACITY.pattern,)  # quota / "not enough capacity" job failures

    def __init__(self, credential: Any = None, transport: Any = None, log_poll: float | None = None) -> None:
        self.credential, self.transport = credential, transport  # injected by tests; default: the Azure chain
        # seconds between polls of logs and status (the workspace API is rate-limited); tests shorten them
        self.log_poll = log_poll or float(os.environ.get("CLOUDTRAIN_AZURE_POLL", "5"))
        self.poll_seconds = self.log_poll
        self._clients: dict[tuple[str, ...], Any] = {}

    def _client(self, scope: tuple[str, ...]) -> Any:
        if scope not in self._clients:
            self._clients[scope] = ml_client(scope, self.credential, self.transport)
        return self._clients[scope]

    def workspace(self, options: Any) -> tuple[str, str, str]:
        """(subscription, resource group, workspace) of ``options`` (a spec's providers.azure), the rest resolved
        as a plan resolves it."""
        return workspace_of(options, self.setting)

    # -- plan (offline) --------------------------------------------------------------------------------
    def _translate(self, ctx: PlanContext) -> Translation:
        spec, package = ctx.spec, ctx.package
        job_name = new_job_id(str(spec.name))
        spec, checkpoint_notes = aj.without_local_checkpoints(spec)
        options = spec.providers.azure
        instance = None if options.compute else catalog.instance_for(
            "azure", spec.accelerator_model, spec.gpus_per_node, options.instance_type)
        machine = catalog.machine_of("azure", instance, spec.accelerator_model, spec.gpus_per_node) if instance \
            else None  # a named cluster: its VM size is the workspace's, unseen offline
        nproc = self.processes(spec, machine.gpus if machine else None)
        args = bootstrap_args(spec, bundle=BUNDLE_NAME, digest=package.digest, workdir=aj.WORKDIR, job_id=job_name,
                              contract=self.declaration.node_path(), nproc=nproc)
        job, runtime, notes = aj.command_job(spec, job_name=job_name, digest=package.digest, bootstrap=args)
        notes[:0] = checkpoint_notes
        schema.check_job(job, aj.SPEC_FIELDS)  # what load_job would reject, from the snapshot: no SDK import
        body = rest.body(job)  # codeId: the code folder, which submit uploads and replaces with its asset id
        nodes = ctx.node_commands(spec, job_id=job_name, python="python", bootstrap=BOOTSTRAP_NAME, args=args,
                                   env=job["environment_variables"])
        if nproc is None:
            notes.append(f"azure: the VM size of cluster {options.compute!r} is not known offline: each node starts "
                         "one process per GPU it has (1 without GPUs); set accelerator or procs_per_node to fix it")
        staging = {"code": aj.CODE_DIR, "upload": "the workspace's default datastore, by content hash, at submit"}
        try:  # offline: the spec, the profile or ./config.json; a dry run may leave it for later
            staging["workspace"] = "/".join(workspace_of(options, lambda key, _spec: ctx.setting(key)))
        except SpecError as exc:
            notes.append(f"azure: {exc.message}; submitting needs them (the spec, `cloudtrain config set "
                         "azure.workspace ...` or the workspace's config.json)")
        if options.compute:
            staging["compute"] = options.compute
        return Translation(job_id=job_name, spec=spec, request={"job": job, "rest": body}, nodes=nodes,
                           staging=staging, notes=notes, machine=machine, image=_image_of(job["environment"]),
                           runtime=runtime)

    # -- submit ----------------------------------------------------------------------------------------
    def _submit(self, plan: Planned) -> JobHandle:
        options = plan.spec.providers.azure
        scope = self.workspace(options)
        handle = self.handle(plan.job_id, scope)
        ml = self._client(scope)

        def find() -> JobHandle | None:  # the job this plan created already (a retried submit), if any
            existing = self._get(ml, plan.job_id)
            if existing is None:
                return None
            if (existing.tags or {}).get(aj.DIGEST_TAG) != plan.package.digest:
                raise UserError(f"an Azure ML job named {plan.job_id} already exists and is not this plan's",
                                remedy="plan the job again (it gets a new name)")
            return handle

        def create() -> JobHandle:
            entity = load_validated(plan.request["job"], str(plan.package.staging_folder()))
            started = time.monotonic()
            with azure_errors(f"creating Azure ML job {plan.job_id}"):
                ml.jobs.create_or_update(entity)  # uploads the code folder unless its content hash is known
            # the timeline's staged event: the code's upload is part of the create
            STAGED.update(bytes=plan.package.bundle_bytes, seconds=round(time.monotonic() - started, 3),
                          at=time.time(), with_create=True)
            return handle

        from azure.core.exceptions import ServiceRequestError, ServiceResponseError

        return self.created_once(find, create, lost=(ServiceRequestError, ServiceResponseError, TransientError))

    @staticmethod
    def _get(ml: Any, name: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        with azure_errors(f"looking up Azure ML job {name}"):
            try:
                return ml.jobs.get(name)
            except ResourceNotFoundError:
                return None

    def _resubmit(self, handle: JobHandle, new_name: str) -> JobHandle:
        ml = self._client(self._scope(handle))
        again = self.handle(new_name, handle.scope)
        existing = self._get(ml, new_name)
        if existing is not None:
            if (existing.tags or {}).get(aj.RESTART_OF_TAG) == handle.job_id:
                return again  # created by a resubmission that did not get to record it
            raise UserError(f"an Azure ML job named {new_name} already exists", remedy="choose another name")
        job = self._get(ml, handle.job_id)
        if job is None:
            raise HandleError(f"no Azure ML job {handle.job_id}", remedy="check the handle")
        job.name = new_name
        job.tags = {**(job.tags or {}), aj.RESTART_OF_TAG: handle.job_id}
        with azure_errors(f"resubmitting {handle} as {new_name}"):
            ml.jobs.create_or_update(job)  # same code asset, environment, variables and checkpoint URI
        return again

    # -- follow ----------------------------------------------------------------------------------------
    @staticmethod
    def _scope(handle: JobHandle) -> tuple[str, str, str]:
        if len(handle.scope) != 3:
            raise HandleError(f"{handle} is not an Azure ML job handle",
                              remedy="handles look like azure://SUBSCRIPTION/RESOURCE_GROUP/WORKSPACE/JOB")
        return handle.scope[0], handle.scope[1], handle.scope[2]

    @staticmethod
    def _run_details(ml: Any, name: str) -> Any:
        with azure_errors(f"reading run details of {name}"):
            return ml.jobs._runs_operations.get_run_details(name)  # the run history behind the job (logs, error)

    @staticmethod
    def _error_text(details: Any) -> str:
        error = getattr(getattr(details, "error", None), "error", None)
        return " ".join(filter(None, [getattr(error, "code", None), getattr(error, "message", None)]))

    def _status(self, ml: Any, handle: JobHandle, job: Any) -> JobStatus:
        status = str(getattr(job.status, "value", job.status) or "Unknown")  # a str enum in some SDK versions
        error = self._error_text(self._run_details(ml, handle.job_id)) if status == "Failed" else ""
        state, message = job_state(status, error)
        tags = job.tags or {}
        created: Any = getattr(getattr(job, "creation_context", None), "created_at", None)
        details = {"azure_status": status, "restart_of": tags.get(aj.RESTART_OF_TAG), "compute": job.compute,
                   "experiment": job.experiment_name, "studio_url": getattr(job, "studio_url", None)}
        return JobStatus(handle=handle, name=job.display_name or job.name, state=state, message=message,
                         created_at=float(created.timestamp()) if hasattr(created, "timestamp") else None,
                         details={k: v for k, v in details.items() if v is not None},
                         max_restarts=int(tags.get(aj.RESTARTS_TAG, "0") or 0),
                         output_uri=(getattr(job, "environment_variables", None) or {}).get(contract.OUTPUT_URI))

    def _describe(self, handle: JobHandle) -> JobStatus:
        ml = self._client(self._scope(handle))
        job = self._get(ml, handle.job_id)
        if job is None:
            raise HandleError(f"no Azure ML job {handle.job_id} in workspace {handle.scope[2]}",
                              remedy="check the handle (`cloudtrain list --provider azure`)")
        return self._status(ml, handle, job)

    def _cancel(self, handle: JobHandle) -> None:
        ml = self._client(self._scope(handle))
        with azure_errors(f"cancelling {handle}"):
            ml.jobs.begin_cancel(handle.job_id)  # the service stops it; describe shows the progress

    def _list(self, limit: int) -> builtins.list[JobStatus]:
        from cloudtrain.providers.azure.options import AzureOptions
        from cloudtrain.spec.model import project_options

        # the workspace of the project here (cloudtrain.yaml), else the profile's, else the standard config.json
        known = project_options("azure")
        scope = self.workspace(AzureOptions.model_construct(**{k: known.get(k) for k in ("subscription_id",
                                                                                      "resource_group", "workspace")}))
        ml = self._client(scope)
        found = []
        with azure_errors("listing Azure ML jobs"):
            for job in ml.jobs.list():
                if (job.tags or {}).get(aj.MANAGED_TAG) == "true":
                    found.append(self._status(ml, self.handle(job.name, scope), job))
                if len(found) >= limit:
                    break
        return found

    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        """Each node's user log (``user_logs/std_log_process_<node>.txt``, one bootstrap process per node),
        read from where the last read stopped, prefixed ``[node N]``."""
        ml = self._client(self._scope(handle))
        offsets: dict[str, int] = {}
        partial: dict[str, str] = {}

        def node(name: str) -> str:
            return name.rsplit("_", 1)[-1].removesuffix(".txt")

        def read() -> Iterator[str]:
            files = getattr(self._run_details(ml, handle.job_id), "log_files", None) or {}
            for name in sorted(n for n in files if n.startswith("user_logs/std_log")):
                lines = (partial.pop(name, "") + self._read_from(files[name], offsets, name)).split("\n")
                if lines[-1]:
                    partial[name] = lines[-1]  # an unfinished line waits for the rest
                yield from (f"[node {node(name)}] {line}" for line in lines[:-1])

        return self.follow_logs(handle, follow, read, self.log_poll,
                                rest=lambda: (f"[node {node(name)}] {text}" for name, text in partial.items()))

    @staticmethod
    def _read_from(url: str, offsets: dict[str, int], name: str) -> str:
        from azure.storage.blob import BlobClient

        blob = BlobClient.from_blob_url(url)
        with azure_errors(f"reading {name}"):
            size = blob.get_blob_properties().size
            start = offsets.get(name, 0)
            if size <= start:
                return ""
            data = blob.download_blob(offset=start, length=size - start).readall()
        offsets[name] = start + len(data)
        return data.decode("utf-8", errors="replace")


def _image_of(environment: str | dict[str, Any]) -> str:
    """An Azure ML environment reference, or the image of an inline one."""
    return environment if isinstance(environment, str) else str(environment.get("image", environment))
