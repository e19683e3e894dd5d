"""Google Vertex AI custom jobs: plan offline, submit through aiplatform_v1's JobServiceClient (REST), follow Cloud
Logging, cancel, list, and resubmit jobs that ended preempted.

Every node runs cloudtrain's bootstrap (the same file a local node runs) as the container command of the prebuilt
PyTorch image, read from the staged bundle through Vertex's /gcs mount; the bootstrap reads CLUSTER_SPEC and starts
torchrun with static ranks. Jobs get a numeric id from Vertex; handles are gcp://PROJECT/REGION/ID.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
from cloudtrain.bundle.staging import bundle_prefix, cloud_locations, new_job_id, stage_bundle
from cloudtrain.errors import HandleError, SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import Capability, JobStatus, Summary, where
from cloudtrain.platforms import catalog
from cloudtrain.platforms.images import Runtime, custom
from cloudtrain.platforms.node_commands import bootstrap_args
from cloudtrain.providers.base import Provider
from cloudtrain.providers.gcp import PROVIDER
from cloudtrain.providers.gcp import request as rq
from cloudtrain.providers.gcp.clients import (
    CAPACITY,
    DEFAULT_REGION,
    aiplatform,
    credentials_for,
    gcp_errors,
    http_session,
    job_client,
    logging_endpoint,
    vertex_endpoint,
)
from cloudtrain.providers.gcp.images import runtime_for
from cloudtrain.providers.gcp.machines import machine_for
from cloudtrain.providers.gcp.schema import check_request
from cloudtrain.providers.gcp.status import describe_details, job_state, since_key
from cloudtrain.providers.translation import PlanContext, Planned, Translation
from cloudtrain.spec.model import JobSpec, project_options

# CustomJob fields the service sets: cleared before a job is created again from a copy.
OUTPUT_ONLY = ("name", "state", "create_time", "start_time", "end_time", "update_time", "error", "web_access_uris",
               "satisfies_pzs", "satisfies_pzi")


def plan_summary(plan: Planned) -> Summary:
    """The plan summary's Vertex line: the project and region."""
    return Summary(where=where(("project", plan.staging.get("project")), ("region", plan.staging.get("region"))))


class VertexProvider(Provider):
    declaration = PROVIDER
    capabilities = frozenset({Capability.MULTI_NODE, Capability.SPOT, Capability.ACCELERATORS, Capability.RESUBMIT})
    # a job that failed with "The resources are insufficient in region ..." or a RESOURCE_EXHAUSTED quota
    capacity_patterns = (CAPACITY.pattern,)

    def __init__(self, endpoint: str | None = None, credentials: Any = None, logging_endpoint: str | None = None,
                 log_poll: float | None = None) -> None:
        self.endpoint = endpoint  # None: CLOUDTRAIN_VERTEX_ENDPOINT, else the region's Vertex endpoint
        self.logging_endpoint = logging_endpoint
        self.credentials = credentials  # None: anonymous for a local http:// endpoint, else ADC
        self.log_poll = log_poll or float(os.environ.get("CLOUDTRAIN_GCP_LOG_POLL", "5"))  # seconds, `logs -f`
        self.poll_seconds = float(os.environ.get("CLOUDTRAIN_GCP_POLL", "5"))  # `wait`, read by the CLI
        self.create_timeout = 60.0  # seconds for a create's answer; then the job is looked up by its plan label
        self.status_timeout = 60.0  # seconds for a status answer; then it is a TransientError (recovery retries)
        self._clients: dict[str, Any] = {}

    def _client(self, region: str) -> Any:
        endpoint = vertex_endpoint(region, self.endpoint)
        if endpoint not in self._clients:
            creds = credentials_for(endpoint, self.credentials)
            self._clients[endpoint] = job_client(endpoint, creds)
        return self._clients[endpoint]

    # -- plan (pure: no network, no credentials) --------------------------------------------------------
    def _target(self, ctx: PlanContext, spec: JobSpec) -> tuple[rq.Target, Runtime, list[str]]:
        options = spec.providers.gcp
        notes: list[str] = []
        region = ctx.chosen("region")
        if not region:
            region = DEFAULT_REGION
            notes.append(f"gcp: no region set (providers.gcp.region, CLOUDTRAIN_GCP_REGION or gcloud's ai/region): "
                         f"using {region}")
        machine = machine_for(spec.accelerator_model, spec.gpus_per_node, options.machine_type,
                              options.accelerator_type)
        runtime, image_notes = (custom(spec.image.uri), []) if spec.image.uri else runtime_for(spec, region)
        notes += image_notes
        project = ctx.staged("project", rq.PLACEHOLDER_PROJECT, notes)
        bucket = ctx.staged("bucket", rq.PLACEHOLDER_BUCKET, notes)
        return rq.Target(project=project, region=region, bucket=bucket, machine=machine, image=runtime.image), \
            runtime, notes

    def _translate(self, ctx: PlanContext) -> Translation:
        spec, package = ctx.spec, ctx.package
        assert spec.name
        if spec.providers.gcp.capacity == "spot" and not spec.spot:  # the same job as `spot: true`, everywhere
            spec = spec.model_copy(update={"spot": True})
        target, runtime, notes = self._target(ctx, spec)
        home = f"gs://{target.bucket}/cloudtrain"
        job_id = new_job_id(str(spec.name))
        spec, output, located = cloud_locations(spec, home, "gcp", job_id)
        notes += located
        prefix = bundle_prefix(home, package)
        nproc = self.processes(spec, target.machine.accelerator_count)
        mounted = rq.gcs_path(prefix)
        args = bootstrap_args(spec, bundle=f"{mounted}/{BUNDLE_NAME}", digest=package.digest, workdir=rq.WORKDIR,
                              job_id=job_id, contract=self.declaration.node_path(), nproc=nproc)
        command = [rq.PYTHON, f"{mounted}/{BOOTSTRAP_NAME}"]
        options = spec.providers.gcp
        request, more_notes = rq.custom_job(spec, job_id=job_id, target=target, digest=package.digest,
                                            command=command, args=args, output_dir=output,
                                            strategy=options.capacity.upper() if options.capacity else None,
                                            max_wait=options.flex_start_max_wait)
        check_request(request["customJob"])
        nodes = ctx.node_commands(spec, job_id=job_id, python=rq.PYTHON, bootstrap=command[1], args=args,
                                   env=rq.node_environment(spec))
        chosen = target.machine
        machine = catalog.machine_of("gcp", chosen.machine_type, spec.accelerator_model, chosen.accelerator_count,
                                     chosen.accelerator_type)
        return Translation(job_id=job_id, spec=spec, request=request, nodes=nodes,
                           staging={"prefix": prefix, "bundle": f"{prefix}/{BUNDLE_NAME}", "project": target.project,
                                    "region": target.region},
                           notes=[*notes, *more_notes], machine=machine, image=target.image, runtime=runtime)

    def _capacity(self, spec: JobSpec) -> str:
        capacity = spec.providers.gcp.capacity
        if capacity == "flex_start":
            return "flex_start"
        return "spot" if spec.spot or capacity == "spot" else "on_demand"

    # -- submit ----------------------------------------------------------------------------------------
    def _submit(self, plan: Planned) -> JobHandle:
        project, region = plan.staging["project"], plan.staging["region"]
        job = self._proto(plan.request["customJob"])  # the SDK's own parser: the last check before sending
        parent = plan.request["parent"]
        with gcp_errors(f"staging the bundle under {plan.staging['prefix']}"):
            stage_bundle(plan.package, plan.staging["prefix"])
        client = self._client(region)
        digest = plan.package.digest.split(":", 1)[-1][:63]
        from google.api_core import exceptions as api

        def find() -> JobHandle | None:  # the job this plan created (it carries the plan's label), if any
            found = self._find(client, parent, plan.job_id, digest)
            return self.handle(found, (project, region)) if found else None

        lost = (api.DeadlineExceeded, api.ServiceUnavailable, api.InternalServerError, OSError)

        def create() -> JobHandle:
            created = client.create_custom_job(parent=parent, custom_job=job, timeout=self.create_timeout)
            return self.handle(created.name.rsplit("/", 1)[1], (project, region))

        # a lost answer (timeout, 5xx): the job may exist, and it is ours if it carries this plan's label
        with gcp_errors(f"creating custom job {plan.job_id}", create=True):
            return self.created_once(find, create, lost=lost)

    @staticmethod
    def _proto(body: dict[str, Any]) -> Any:
        try:
            return aiplatform().CustomJob.from_json(json.dumps(body), ignore_unknown_fields=False)
        except Exception as exc:  # json_format.ParseError (and ValueError/TypeError from proto-plus)
            raise UserError(f"the CustomJob does not parse as aiplatform_v1.CustomJob: {exc}",
                            remedy="check the plan (`cloudtrain plan --provider gcp -o json`)") from None

    def _find(self, client: Any, parent: str, plan_id: str, digest: str | None = None) -> str | None:
        """The id of the job a plan (or a resubmission) already created, if any."""
        with gcp_errors(f"looking up custom jobs labelled {rq.PLAN_LABEL}={plan_id}"):
            pager = client.list_custom_jobs(request={"parent": parent, "filter": f'labels.{rq.PLAN_LABEL}="{plan_id}"',
                                                     "page_size": 10})
            jobs = [j for j in pager if j.labels.get(rq.PLAN_LABEL) == plan_id]  # whatever the filter did
        if not jobs:
            return None
        if digest and jobs[0].labels.get(rq.DIGEST_LABEL) != digest:
            raise UserError(f"a custom job labelled {rq.PLAN_LABEL}={plan_id} already exists and is not this plan's",
                            remedy="plan the job again (it gets a new name)")
        return str(jobs[0].name.rsplit("/", 1)[1])

    def _resubmit(self, handle: JobHandle, new_name: str) -> JobHandle:
        """A copy of the job as Vertex holds it (same image, bundle, checkpoint URI, environment), named
        ``new_name``; a job already labelled with that name is the one a retried call created."""
        CustomJob = aiplatform().CustomJob

        project, region = self._scope(handle)
        client = self._client(region)
        parent = f"projects/{project}/locations/{region}"
        found = self._find(client, parent, new_name)
        if found:
            return self.handle(found, handle.scope)
        with gcp_errors(f"reading {handle} to resubmit it"):
            job = client.get_custom_job(name=self._resource(handle))
        copy = CustomJob.deserialize(CustomJob.serialize(job))
        for field in OUTPUT_ONLY:
            CustomJob.pb(copy).ClearField(field)
        copy.display_name = new_name
        copy.labels[rq.PLAN_LABEL] = new_name
        copy.labels[rq.RESUBMIT_LABEL] = handle.job_id
        with gcp_errors(f"resubmitting {handle} as {new_name}", create=True):
            created = client.create_custom_job(parent=parent, custom_job=copy, timeout=self.create_timeout)
        return self.handle(created.name.rsplit("/", 1)[1], handle.scope)

    # -- follow ----------------------------------------------------------------------------------------
    @staticmethod
    def _scope(handle: JobHandle) -> tuple[str, str]:
        if len(handle.scope) != 2:
            raise HandleError(f"{handle} is not a Vertex job handle", remedy="handles look like gcp://PROJECT/REGION/ID")
        return handle.scope[0], handle.scope[1]

    def _resource(self, handle: JobHandle) -> str:
        project, region = self._scope(handle)
        return f"projects/{project}/locations/{region}/customJobs/{handle.job_id}"

    def _job(self, handle: JobHandle) -> dict[str, Any]:
        client = self._client(self._scope(handle)[1])
        with gcp_errors(f"describing {handle}"):
            return self._as_json(client.get_custom_job(name=self._resource(handle), timeout=self.status_timeout))

    @staticmethod
    def _as_json(job: Any) -> dict[str, Any]:
        return dict(json.loads(type(job).to_json(job, use_integers_for_enums=False)))

    @staticmethod
    def _status(handle: JobHandle, job: dict[str, Any]) -> JobStatus:
        error = (job.get("error") or {}).get("message", "")
        state, message = job_state(job.get("state", ""), error, started=bool(job.get("startTime")))

        def stamp(key: str) -> float | None:
            value = job.get(key)
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None

        def since() -> float | None:  # a time the timeline may take: one it cannot read is not said
            try:
                return stamp(since_key(job.get("state", "")))
            except (ValueError, TypeError, AttributeError):
                return None

        details = describe_details(job)
        return JobStatus(handle=handle, name=job.get("displayName", handle.job_id), state=state, message=message,
                         created_at=stamp("createTime"), started_at=stamp("startTime"), ended_at=stamp("endTime"),
                         max_restarts=details.pop("max_restarts"), output_uri=details.pop("output_uri", None),
                         details=details, state_since=since())

    def _describe(self, handle: JobHandle) -> JobStatus:
        return self._status(handle, self._job(handle))

    def _cancel(self, handle: JobHandle) -> None:
        client = self._client(self._scope(handle)[1])
        with gcp_errors(f"cancelling {handle}"):
            client.cancel_custom_job(name=self._resource(handle))

    def _list(self, limit: int) -> builtins.list[JobStatus]:
        known = project_options("gcp")
        project = self.setting("project", known.get("project"))
        region = self.setting("region", known.get("region")) or DEFAULT_REGION
        if not project:
            raise SpecError("no Google Cloud project is set", field="providers.gcp.project",
                            remedy="set it in ./cloudtrain.yaml, `cloudtrain config set gcp.project ...`, "
                                   "CLOUDTRAIN_GCP_PROJECT (or GOOGLE_CLOUD_PROJECT) or `gcloud config set project`")
        client = self._client(region)
        found: list[dict[str, Any]] = []
        with gcp_errors("listing Vertex custom jobs"):
            pager = client.list_custom_jobs(request={"parent": f"projects/{project}/locations/{region}",
                                                     "filter": f'labels.{rq.MANAGED_LABEL}="true"',
                                                     "page_size": min(100, limit)})
            for job in pager:
                if job.labels.get(rq.MANAGED_LABEL) == "true":
                    found.append(self._as_json(job))
                if len(found) >= limit:
                    break
        found.sort(key=lambda j: j.get("createTime") or "", reverse=True)
        return [self._status(self.handle(j["name"].rsplit("/", 1)[1], (project, region)), j)
                for j in found[:limit]]

    def merged_logs(self, handle: JobHandle) -> Iterator[str]:
        """`logs --merge`: Cloud Logging returns the nodes' entries oldest first, already one stream."""
        return self.logs(handle)

    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        """Every node's Cloud Logging entries (resource ml_job), oldest first, each prefixed with its task name."""
        project, _ = self._scope(handle)
        endpoint = logging_endpoint(self.logging_endpoint)
        session = http_session(credentials_for(endpoint, self.credentials))
        base = f'resource.type="ml_job" AND resource.labels.job_id="{handle.job_id}"'
        since, seen = "", set[str]()  # entries at the newest timestamp read, so a re-read prints nothing twice

        def read() -> Iterator[str]:
            nonlocal since, seen
            query = f'{base} AND timestamp>="{since}"' if since else base
            for entry in self._entries(session, endpoint, project, query, handle):
                key = entry.get("insertId") or json.dumps(entry, sort_keys=True)
                if key in seen:
                    continue
                if entry.get("timestamp", "") > since:
                    since, seen = entry["timestamp"], set()
                seen.add(key)
                task = (entry.get("resource", {}).get("labels", {}).get("task_name") or
                        entry.get("labels", {}).get("ml.googleapis.com/task_name") or "job")
                text = entry.get("textPayload")
                if text is None:
                    text = (entry.get("jsonPayload") or {}).get("message", "")
                yield from (f"[{task}] {line}" for line in str(text).rstrip("\n").split("\n"))

        return self.follow_logs(handle, follow, read, self.log_poll)

    @staticmethod
    def _entries(session: Any, endpoint: str, project: str, query: str, handle: JobHandle) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            body: dict[str, Any] = {"resourceNames": [f"projects/{project}"], "filter": query,
                                    "orderBy": "timestamp asc", "pageSize": 1000}
            if token:
                body["pageToken"] = token
            with gcp_errors(f"reading logs of {handle}"):
                from google.api_core.exceptions import from_http_response

                response = session.post(f"{endpoint.rstrip('/')}/v2/entries:list", json=body, timeout=60)
                if response.status_code >= 400:
                    raise from_http_response(response)
                page = response.json()
            yield from page.get("entries", [])
            token = page.get("nextPageToken")
            if not token:
                return
