"""Amazon SageMaker training jobs: plan offline, submit through boto3, follow CloudWatch, stop, list.

Every node runs cloudtrain's bootstrap (the same file a local node runs) as the container entrypoint of the prebuilt
PyTorch image; the bootstrap reads SageMaker's resourceconfig.json and starts torchrun with static ranks.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from typing import Any

from cloudtrain import registry
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
from cloudtrain.bundle.staging import bundle_prefix, cloud_locations, new_job_id, stage_bundle
from cloudtrain.errors import HandleError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import Capability, JobStatus, Summary, where
from cloudtrain.platforms import catalog
from cloudtrain.platforms.images import Runtime, custom
from cloudtrain.platforms.node_commands import bootstrap_args, launcher_note
from cloudtrain.providers.aws import PROVIDER
from cloudtrain.providers.aws import request as rq
from cloudtrain.providers.aws.clients import aws_errors, configured_region, session
from cloudtrain.providers.aws.images import runtime_for
from cloudtrain.providers.aws.status import describe_details, job_state
from cloudtrain.providers.aws.validate import check_request
from cloudtrain.providers.base import Provider
from cloudtrain.providers.translation import PlanContext, Planned, Translation
from cloudtrain.spec.model import project_options

LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class _Exists(Exception):
    """CreateTrainingJob said the name is taken: the retry of a create whose answer was lost, if the job is ours."""


def plan_summary(plan: Planned) -> Summary:
    """The plan summary's SageMaker lines: the region, and the spot wait StoppingCondition will use."""
    condition = plan.request.get("StoppingCondition")
    wait = condition.get("MaxWaitTimeInSeconds") if isinstance(condition, dict) else None
    return Summary(where=where(("region", plan.staging.get("region"))), max_wait=wait)


class SageMakerProvider(Provider):
    declaration = PROVIDER
    capabilities = frozenset({Capability.MULTI_NODE, Capability.SPOT, Capability.ACCELERATORS})
    # FailureReason "CapacityError: Unable to provision ..." / "InsufficientCapacityError"; MaxWait spent
    capacity_patterns = (r"CapacityError", r"did not come back within max_wait")

    def __init__(self, client_config: Any = None, log_poll: float | None = None) -> None:
        self.client_config = client_config  # a botocore Config (timeouts, retries); tests shorten them
        self.log_poll = log_poll or float(os.environ.get("CLOUDTRAIN_AWS_LOG_POLL", "5"))  # seconds, `logs -f`
        self._clients: dict[tuple[str, str], Any] = {}

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = session(region).client(service, config=self.client_config)
        return self._clients[key]

    # -- plan (pure: no network, no credentials) --------------------------------------------------------
    def _target(self, ctx: PlanContext) -> tuple[rq.Target, Runtime, list[str]]:
        spec, options = ctx.spec, ctx.spec.providers.aws
        notes: list[str] = []
        region = configured_region(ctx.setting("region"))
        instance_type = catalog.instance_for("aws", spec.accelerator_model, spec.gpus_per_node, options.instance_type)
        runtime, found = (custom(spec.image.uri), []) if spec.image.uri else runtime_for(spec, instance_type, region)
        target = rq.Target(region=region, instance_type=instance_type, image=runtime.image,
                           role=ctx.staged("role", rq.PLACEHOLDER_ROLE, notes),
                           bucket=ctx.staged("bucket", rq.PLACEHOLDER_BUCKET, notes))
        return target, runtime, [*found, *notes]

    def _translate(self, ctx: PlanContext) -> Translation:
        spec, package = ctx.spec, ctx.package
        assert spec.name
        target, runtime, notes = self._target(ctx)
        home = f"s3://{target.bucket}/cloudtrain"
        job_name = new_job_id(str(spec.name))
        spec, output, located = cloud_locations(spec, home, "aws", job_name)
        notes += located
        prefix = bundle_prefix(home, package)
        machine = catalog.machine_of("aws", target.instance_type, spec.accelerator_model, spec.gpus_per_node)
        known = machine.vcpus is not None or machine.gpus  # an explicit type cloudtrain has no data for: unknown
        nproc = self.processes(spec, machine.gpus if known else None)
        args = bootstrap_args(spec, bundle=f"{rq.CHANNEL_DIR}/{BUNDLE_NAME}", digest=package.digest,
                              workdir=rq.WORKDIR, job_id=job_name, contract=self.declaration.node_path(), nproc=nproc)
        request, more_notes = rq.create_training_job(spec, job_name=job_name, target=target, bundle_prefix=prefix,
                                                     digest=package.digest, container_args=args, output_path=output)
        check_request("sagemaker", "CreateTrainingJob", request)
        env = request["Environment"]
        nodes = ctx.node_commands(spec, job_id=job_name, python=rq.PYTHON, args=args, env=env,
                                   bootstrap=f"{rq.CHANNEL_DIR}/{BOOTSTRAP_NAME}", machine_type=target.instance_type)
        contract = registry.node_contract(self.name)
        if note := launcher_note("aws", contract, {**env, **contract.planned(spec.nodes, 0, job_name,
                                                                             target.instance_type)}, machine.gpus):
            notes.append(note)
        return Translation(job_id=job_name, spec=spec, request=request, nodes=nodes,
                           staging={"prefix": prefix, "bundle": f"{prefix}/{BUNDLE_NAME}", "region": target.region},
                           notes=[*notes, *more_notes], machine=machine, image=target.image, runtime=runtime)

    # -- submit ----------------------------------------------------------------------------------------
    def _submit(self, plan: Planned) -> JobHandle:
        request = plan.request  # a placeholder left in it was refused by Provider.submit
        region = plan.staging["region"]
        handle = self.handle(plan.job_id, (region,))
        with aws_errors(f"staging the bundle under {plan.staging['prefix']}"):
            stage_bundle(plan.package, plan.staging["prefix"])
        sm = self._client("sagemaker", region)
        digest = plan.package.digest
        from botocore.exceptions import ClientError

        def create() -> JobHandle:
            with aws_errors(f"creating training job {plan.job_id}"):
                try:
                    sm.create_training_job(**request)
                except ClientError as exc:  # botocore retried a create whose first answer was lost
                    if "already exists" in str(exc):
                        raise _Exists from None
                    raise
            return handle

        try:
            return self.created_once(lambda: handle if self._created_by(sm, plan.job_id, digest) else None, create,
                                     lost=(_Exists,))
        except _Exists:
            raise UserError(f"a training job named {plan.job_id} already exists and is not this plan's",
                            remedy="plan the job again (it gets a new name)") from None
        except UserError as exc:
            if exc.remedy:
                raise
            raise UserError(exc.message, remedy="check the plan (`cloudtrain plan --provider aws -o json`) "
                                                "against the message") from None

    def _created_by(self, sm: Any, job_name: str, digest: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            with aws_errors(f"looking up training job {job_name}"):
                try:
                    arn = sm.describe_training_job(TrainingJobName=job_name)["TrainingJobArn"]
                except ClientError as exc:
                    if "Could not find" in str(exc) or "does not exist" in str(exc):
                        return False
                    raise
                tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn).get("Tags", [])}
        except UserError:
            return False
        if tags.get(rq.DIGEST_TAG) != digest:
            raise UserError(f"a training job named {job_name} already exists and is not this plan's",
                            remedy="plan the job again (it gets a new name)")
        return True

    # -- follow ----------------------------------------------------------------------------------------
    def _job(self, handle: JobHandle) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        sm = self._client("sagemaker", self._region(handle))
        with aws_errors(f"describing {handle}"):
            try:
                return dict(sm.describe_training_job(TrainingJobName=handle.job_id))
            except ClientError as exc:
                if "Could not find" in str(exc):
                    raise HandleError(f"no SageMaker training job {handle.job_id} in {self._region(handle)}",
                                      remedy="check the handle (`cloudtrain list --provider aws`)") from None
                raise

    @staticmethod
    def _region(handle: JobHandle) -> str:
        if len(handle.scope) != 1:
            raise HandleError(f"{handle} is not an AWS job handle", remedy="handles look like aws://REGION/JOB")
        return handle.scope[0]

    @staticmethod
    def _status(handle: JobHandle, job: dict[str, Any]) -> JobStatus:
        state, message = job_state(job.get("TrainingJobStatus", ""), job.get("SecondaryStatus"))
        details = describe_details(job)
        if details.get("failure_reason"):
            message = f"{message}: {details['failure_reason']}"

        def stamp(key: str) -> float | None:
            value: Any = job.get(key)
            return float(value.timestamp()) if hasattr(value, "timestamp") else None

        # the current secondary status's start: SageMaker's own time for the move status sees (Training, Interrupted)
        transitions = job.get("SecondaryStatusTransitions") or []
        last = transitions[-1] if transitions and isinstance(transitions[-1], dict) else {}
        since: Any = last.get("StartTime") if last.get("Status") == job.get("SecondaryStatus") else None
        return JobStatus(handle=handle, name=job.get("TrainingJobName", handle.job_id), state=state, message=message,
                         created_at=stamp("CreationTime"), started_at=stamp("TrainingStartTime"),
                         ended_at=stamp("TrainingEndTime"), output_uri=details.pop("output_uri"), details=details,
                         state_since=float(since.timestamp()) if hasattr(since, "timestamp") else None)

    def _describe(self, handle: JobHandle) -> JobStatus:
        return self._status(handle, self._job(handle))

    def _cancel(self, handle: JobHandle) -> None:
        sm = self._client("sagemaker", self._region(handle))
        with aws_errors(f"stopping {handle}"):
            sm.stop_training_job(TrainingJobName=handle.job_id)

    def _list(self, limit: int) -> builtins.list[JobStatus]:
        region = configured_region(self.setting("region", project_options("aws").get("region")))
        sm = self._client("sagemaker", region)
        found: list[dict[str, Any]] = []
        token = None
        with aws_errors("listing SageMaker training jobs"):
            while len(found) < limit:
                kwargs: dict[str, Any] = {"Resource": "TrainingJob", "SortBy": "CreationTime",
                                          "SortOrder": "Descending", "MaxResults": min(100, limit),
                                          "SearchExpression": {"Filters": [{"Name": f"Tags.{rq.MANAGED_TAG}",
                                                                            "Operator": "Equals", "Value": "true"}]}}
                if token:
                    kwargs["NextToken"] = token
                page = sm.search(**kwargs)
                for result in page.get("Results", []):
                    job = result.get("TrainingJob", {})
                    if any(t.get("Key") == rq.MANAGED_TAG for t in job.get("Tags", [])):  # whatever the filter did
                        found.append(job)
                token = page.get("NextToken")
                if not token:
                    break
        found.sort(key=lambda j: j.get("CreationTime") or 0, reverse=True)
        return [self._status(self.handle(j["TrainingJobName"], (region,)), j) for j in found[:limit]]

    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        """Every node's CloudWatch stream (``<job>/algo-<n>-<epoch>``), each line prefixed with its host."""
        logs = self._client("logs", self._region(handle))
        tokens: dict[str, str] = {}

        def read() -> Iterator[str]:
            yield from (f"[{host}] {event['message']}" for host, event in self._events(logs, handle, tokens))

        return self.follow_logs(handle, follow, read, self.log_poll)

    def merged_logs(self, handle: JobHandle) -> Iterator[str]:
        """Every node's events ordered by their CloudWatch timestamps (`logs --merge`), each prefixed with its host."""
        handle = self._own(handle)
        found = list(self._events(self._client("logs", self._region(handle)), handle, {}))
        found.sort(key=lambda pair: pair[1].get("timestamp", 0))  # stable: one host's events keep their order
        return (f"[{host}] {event['message']}" for host, event in found)

    def _events(self, logs: Any, handle: JobHandle, tokens: dict[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(host, event) of every node's stream from where ``tokens`` left each."""
        for stream in self._streams(logs, handle.job_id):
            host = stream.split("/", 1)[1].rsplit("-", 1)[0]
            while True:
                kwargs = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
                if stream in tokens:
                    kwargs["nextToken"] = tokens[stream]
                with aws_errors(f"reading logs of {handle}"):
                    page = logs.get_log_events(**kwargs)
                yield from ((host, event) for event in page.get("events", []))
                previous, tokens[stream] = tokens.get(stream), page.get("nextForwardToken", "")
                if not page.get("events") or previous == tokens[stream]:
                    break

    @staticmethod
    def _streams(logs: Any, job_name: str) -> builtins.list[str]:
        from botocore.exceptions import ClientError

        names: list[str] = []
        with aws_errors(f"listing log streams of {job_name}"):
            try:
                for page in logs.get_paginator("describe_log_streams").paginate(
                        logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/"):
                    names += [s["logStreamName"] for s in page.get("logStreams", [])]
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                    raise
        return sorted(names)
