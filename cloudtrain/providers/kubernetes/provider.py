"""Kubernetes as a cloudtrain provider.

plan (pure): the TrainJob (or PyTorchJob) checked against the vendored CRD schema and the webhooks' rules, every
node's bootstrap line. submit: stage the bundle (object storage through cloudtrain's storage layer, or ConfigMaps
for a claim), then create the job once, found again by its name after a lost answer. The handle is
``kubernetes://<namespace>/<name>``; status reads the job's conditions (and its pods, for preemption), logs read every
node's pod, cancel suspends the job and marks it cancelled (kept for its status and logs), resubmit copies it.
"""

from __future__ import annotations

import builtins
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from cloudtrain import storage
from cloudtrain.bundle.packaging import BUNDLE_NAME
from cloudtrain.bundle.staging import STAGED, bundle_prefix, cloud_locations, lineage_id, new_job_id, stage_bundle
from cloudtrain.errors import CloudtrainError, HandleError, SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import Capability, JobStatus, Summary, where
from cloudtrain.naming import shortened
from cloudtrain.platforms.catalog import Machine
from cloudtrain.platforms.images import Runtime, custom
from cloudtrain.platforms.node_commands import bootstrap_args, job_env
from cloudtrain.providers.base import Provider
from cloudtrain.providers.kubernetes import PROVIDER, schema
from cloudtrain.providers.kubernetes import request as rq
from cloudtrain.providers.kubernetes.kube import Kube
from cloudtrain.providers.kubernetes.node import RESERVED, pytorchjob_env
from cloudtrain.providers.kubernetes.options import KubernetesOptions
from cloudtrain.providers.kubernetes.settings import platform_setting
from cloudtrain.providers.kubernetes.status import job_state, native_of, since_text, status_fields
from cloudtrain.providers.translation import PlanContext, Planned, Translation
from cloudtrain.spec.model import JobSpec

DEFAULT_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"  # torch-distributed's own (kubeflow/trainer v2.3.0)
CONTAINER = {"TrainJob": "node", "PyTorchJob": "pytorch"}


def plan_summary(plan: Planned) -> Summary:
    """The plan summary's Kubernetes line: the kubeconfig context and the namespace."""
    request = plan.request
    return Summary(where=where(("context", request.get("context") or "current"), ("namespace", request["namespace"])))


class KubernetesProvider(Provider):
    declaration = PROVIDER
    # spot: node_selector/tolerations onto the cluster's spot node pool
    capabilities = frozenset({Capability.MULTI_NODE, Capability.ACCELERATORS, Capability.SPOT, Capability.RESUBMIT})
    poll_seconds = 2.0

    def __init__(self, log_poll: float = 2.0, kube: Kube | None = None) -> None:
        self.log_poll = log_poll
        self._kube = kube

    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(context=self.setting("context"))
        return self._kube

    # -- plan (pure) -------------------------------------------------------------------------------------
    def _translate(self, ctx: PlanContext) -> Translation:
        spec, package = ctx.spec, ctx.package  # its settings filled once, by the planner
        assert spec.name
        options: KubernetesOptions = spec.providers.kubernetes
        notes: list[str] = []
        for name in [n for n in spec.env if n in RESERVED or (options.api == "pytorchjob" and n in
                                                                schema.PYTORCHJOB_RESERVED)]:
            raise SpecError(f"{name} is set by Kubeflow on every node (the node contract reads it, never sets it); the "
                            "cluster refuses a job that sets it", field=f"env.{name}", remedy=f"remove {name} from env")
        staging = ctx.staged("staging", PROVIDER.placeholders["staging"], notes)
        job_id, renamed = job_name(new_job_id(spec.name), options.api, spec.nodes)
        notes += renamed
        namespace = options.namespace or default_namespace(self.setting)
        claim = staging.startswith("pvc://")
        home = f"file://{rq.SHARED_DIR}" if claim else staging
        spec, _output, located = cloud_locations(spec, home, self.name, job_id)
        notes += [n for n in located if "MOVED" in n or "resumes from" in n]
        if spec.max_restarts and not spec.checkpoint.uri:
            spec.checkpoint.uri = f"{home}/checkpoints/{lineage_id(spec)}"
            notes.append(f"kubernetes: restarted runs resume from {spec.checkpoint.uri} (set checkpoint.uri to choose)")
        prefix = bundle_prefix(home if not claim else staging, package)
        source = f"parts:{rq.PARTS_DIR}" if claim else prefix
        nproc = self.processes(spec, spec.gpus_per_node or 0)
        args = bootstrap_args(spec, bundle=f"{rq.BUNDLE_DIR}/{BUNDLE_NAME}", digest=package.digest,
                              workdir=rq.WORKDIR, job_id=job_id, contract=PROVIDER.node_path(), nproc=nproc)
        env = job_env(spec)
        image = spec.image.uri or options.image or (DEFAULT_IMAGE if options.api == "pytorchjob" else None)
        target = rq.Target(namespace=namespace, staging=staging, image=image, digest=package.digest, nproc=nproc,
                           command=rq.node_command(options.python, source, args), env=env,
                           parts=rq.part_names(package.digest, package.bundle_bytes) if claim else [])
        if target.secret_env:
            target.secret = rq.secret_name(job_id)
        if len(target.parts) > rq.MAX_PARTS:
            raise UserError(f"the bundle is {package.bundle_bytes / 2**20:.1f} MiB: more than a claim's staging "
                            f"carries in ConfigMaps ({rq.MAX_PARTS} x {rq.PART_BYTES // 1024} KiB)",
                            field="providers.kubernetes.staging",
                            remedy="stage through object storage (s3://, gs://, az://), or keep data out of the "
                                   "source folder")
        marks = {"digest": package.digest, "output-uri": spec.output_uri, "checkpoint-uri": spec.checkpoint.uri,
                 "max-restarts": spec.max_restarts}
        build = rq.trainjob if options.api == "trainjob" else rq.pytorchjob
        body = build(spec, options, job_id, target, marks)
        schema.check(body)
        seen = (lambda rank: pytorchjob_env(spec.nodes, rank, job_id, nproc or 1)) \
            if options.api == "pytorchjob" else None
        nodes = ctx.node_commands(spec, job_id=job_id, python=options.python,
                                   bootstrap=f"{rq.BUNDLE_DIR}/bootstrap.py", args=args, env=env, seen=seen)
        notes += plan_notes(spec, options, staging, prefix, target)
        request = {"api": options.api, "context": options.context, "namespace": namespace, "object": body,
                   "configmaps": target.parts, "secret": rq.secret(job_id, target)}
        return Translation(job_id=job_id, spec=spec, request=request, nodes=nodes,
                           staging={"prefix": prefix, "bundle": storage.join(prefix, BUNDLE_NAME), "folder": staging},
                           notes=notes, machine=_machine(spec, options),
                           image=image or f"{options.runtime}'s own image", runtime=_runtime(image, options),
                           estimate={"available": False,
                                     "reason": "none: a cluster's nodes are its own (no list prices)"})

    # -- submit ------------------------------------------------------------------------------------------
    def _submit(self, plan: Planned) -> JobHandle:
        request = plan.request
        body, namespace = request["object"], request["namespace"]
        res = rq.TRAINJOB if body["kind"] == "TrainJob" else rq.PYTORCHJOB
        kube = self.kube() if self._kube or not request.get("context") else Kube(context=request["context"])
        self._kube = kube
        handle = self.handle(plan.job_id, (namespace,))
        if request.get("secret") and not self._may_write_secrets(kube, namespace):
            # asked before anything is staged or created: the job must own its Secret (or it outlives the job)
            raise UserError(f"this job has secret variables, kept in a Secret, and this account may not create and "
                            f"patch secrets in {namespace}", field="env",
                            remedy="grant the Role in docs/providers/kubernetes.md (RBAC), or pass the job no "
                                   "secret variables")
        if request["configmaps"]:
            started = time.monotonic()
            self._stage_parts(kube, plan)
            STAGED.update(bytes=plan.package.bundle_bytes, seconds=round(time.monotonic() - started, 3),
                          at=time.time(), configmaps=len(request["configmaps"]))  # the timeline's staged event
        else:
            stage_bundle(plan.package, plan.staging["prefix"])
        if request.get("secret"):
            kube.put_secret(namespace, request["secret"])

        def find() -> JobHandle | None:
            found = kube.get(res, namespace, plan.job_id)
            if found is None:
                return None
            digest = ((found.get("metadata") or {}).get("annotations") or {}).get(rq.ANNOTATION + "digest")
            if digest != plan.package.digest:
                raise UserError(f"a {body['kind']} named {plan.job_id} exists in {namespace} and is not this plan's",
                                remedy="plan the job again (it gets a new name)")
            return handle

        def create() -> JobHandle:
            try:
                kube.create(res, namespace, body)
            except CloudtrainError as exc:
                if "AlreadyExists" in exc.message or "already exists" in exc.message:  # a retry raced us
                    found = find()
                    if found:
                        return found
                raise
            return handle

        try:
            created = self.created_once(find, create, lost=kube.lost())
        except CloudtrainError:
            if request.get("secret") and kube.get(res, namespace, plan.job_id) is None:  # refused: no job, no Secret
                kube.delete_secret(namespace, request["secret"]["metadata"]["name"])
            raise
        if request.get("secret"):  # deleted with the job (the cluster's garbage collector follows ownerReferences)
            kube.own_secret(namespace, request["secret"]["metadata"]["name"], res, plan.job_id)
        return created

    @staticmethod
    def _may_write_secrets(kube: Kube, namespace: str) -> bool:
        """Whether this account may create and patch secrets there; a cluster that will not say (no access reviews
        for this account) is taken at its word later: creating the Secret fails with the API server's own refusal."""
        try:
            return all(kube.can(verb, "", "secrets", namespace) for verb in ("create", "patch"))
        except CloudtrainError:
            return True

    def _stage_parts(self, kube: Kube, plan: Planned) -> None:
        """The bundle in ConfigMaps (content-addressed, immutable): those already there are kept."""
        target_parts = plan.request["configmaps"]
        namespace = plan.request["namespace"]
        target = rq.Target(namespace=namespace, staging=plan.staging["folder"], image=None,
                           digest=plan.package.digest, nproc=None, command=[], env={}, parts=target_parts)
        bodies = rq.configmaps(target, plan.package.bootstrap.read_bytes(), plan.package.path.read_bytes())
        for body in bodies:
            if kube.configmap(namespace, body["metadata"]["name"]) is None:
                kube.create_configmap(namespace, body)

    # -- follow ------------------------------------------------------------------------------------------
    def _find(self, handle: JobHandle) -> tuple[dict[str, Any], tuple[str, str, str, str]]:
        namespace = self._namespace(handle)
        for res in (rq.TRAINJOB, rq.PYTORCHJOB):
            try:
                found = self.kube().get(res, namespace, handle.job_id)
            except UserError:  # that kind's CRD is not installed
                continue
            if found is not None:
                return found, res
        raise HandleError(f"no TrainJob or PyTorchJob named {handle.job_id} in namespace {namespace}",
                          remedy="`cloudtrain list --provider kubernetes` shows them (set providers.kubernetes."
                                 "context for another cluster)")

    @staticmethod
    def _namespace(handle: JobHandle) -> str:
        if len(handle.scope) != 1:
            raise HandleError(f"{handle} is not a Kubernetes handle", remedy="use kubernetes://NAMESPACE/NAME")
        return handle.scope[0]

    def _pods(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        meta = obj["metadata"]
        selector = (f"jobset.sigs.k8s.io/jobset-name={meta['name']}" if obj["kind"] == "TrainJob"
                    else f"training.kubeflow.org/job-name={meta['name']}")
        return self.kube().pods(meta["namespace"], selector)

    def _describe(self, handle: JobHandle) -> JobStatus:
        obj, _ = self._find(handle)
        pods = self._pods(obj)
        native = native_of(obj, pods)
        state, message = job_state(native)
        conditions = (obj.get("status") or {}).get("conditions") or []
        started = min((_epoch(p.get("status", {}).get("startTime")) or 0 for p in pods), default=0) or None
        ended = max((_epoch(c.get("lastTransitionTime")) or 0 for c in conditions if c.get("status") == "True"),
                    default=0) or None
        return JobStatus(handle=handle, name=handle.job_id, state=state, message=message,
                         created_at=_epoch(obj["metadata"].get("creationTimestamp")), started_at=started,
                         ended_at=ended if state.terminal else None,
                         state_since=_epoch(since_text(obj, native, state)),
                         **status_fields(obj, native, self.kube().context))

    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        obj, res = self._find(handle)
        container = CONTAINER[obj["kind"]]
        seen: dict[str, int] = {}
        partial: dict[str, str] = {}

        def read() -> Iterator[str]:
            for rank, pod in sorted((node_rank(p), p["metadata"]["name"]) for p in self._pods(obj)):
                text = self.kube().log(obj["metadata"]["namespace"], pod, container)
                lines = text.split("\n")
                partial[f"node-{rank}"] = lines.pop()  # the text after the last newline: not a line yet
                start = seen.get(pod, 0) if len(lines) >= seen.get(pod, 0) else 0  # restarted: a new log
                seen[pod] = len(lines)
                yield from (f"[node-{rank}] {line}" for line in lines[start:])

        def rest() -> Iterator[str]:
            yield from (f"[{node}] {text}" for node, text in sorted(partial.items()) if text.strip())

        version = [str(obj["metadata"].get("resourceVersion") or "0")]

        def pause(seconds: float) -> None:  # until the job changes (it may have ended), or the next poll
            version[0] = self.kube().watch_once(res, obj["metadata"]["namespace"], obj["metadata"]["name"],
                                                version[0], seconds)

        return self.follow_logs(handle, follow, read, self.log_poll, rest, pause)

    def _cancel(self, handle: JobHandle) -> None:
        obj, res = self._find(handle)
        mark = {"metadata": {"annotations": {rq.ANNOTATION + "cancelled": "true"}}}
        spec = {"suspend": True} if obj["kind"] == "TrainJob" else {"runPolicy": {"suspend": True}}
        self.kube().patch(res, self._namespace(handle), handle.job_id, {**mark, "spec": spec})

    def _list(self, limit: int) -> builtins.list[JobStatus]:
        namespace = self.setting("namespace") or default_namespace(self.setting)
        found = []
        for res in (rq.TRAINJOB, rq.PYTORCHJOB):
            try:
                items = self.kube().list(res, namespace, f"{rq.LABEL_MANAGED}=cloudtrain")
            except UserError:
                continue
            for obj in items:
                obj.setdefault("kind", res[3])
                native = native_of(obj)
                state, message = job_state(native)
                meta = obj["metadata"]
                found.append(JobStatus(handle=self.handle(meta["name"], (meta.get("namespace", namespace),)),
                                       name=meta["name"], state=state, message=message,
                                       created_at=_epoch(meta.get("creationTimestamp")),
                                       **status_fields(obj, native, self.kube().context)))
        return sorted(found, key=lambda s: s.created_at or 0, reverse=True)[:limit]

    def _resubmit(self, handle: JobHandle, new_name: str) -> JobHandle:
        """A copy of the job as the cluster holds it (same image, bundle, checkpoint URI and env), named
        ``new_name``, so it resumes from its newest checkpoint; one already named so is the retried call's."""
        obj, res = self._find(handle)
        namespace = self._namespace(handle)
        new_name = job_name(new_name, "trainjob" if obj["kind"] == "TrainJob" else "pytorchjob", _nodes(obj))[0]
        again = self.handle(new_name, handle.scope)
        meta = obj["metadata"]
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != rq.ANNOTATION + "cancelled"}
        body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "spec": dict(obj["spec"]),
                "metadata": {"name": new_name, "namespace": namespace,
                             "labels": {**(meta.get("labels") or {}), rq.LABEL_JOB: new_name},
                             "annotations": {**annotations, rq.ANNOTATION + "resubmit-of": handle.job_id}}}
        body["spec"].pop("suspend", None)
        if obj["kind"] == "PyTorchJob":
            body["spec"]["runPolicy"] = {k: v for k, v in body["spec"].get("runPolicy", {}).items() if k != "suspend"}
        schema.check(body)
        kube = self.kube()

        def find() -> JobHandle | None:
            found = kube.get(res, namespace, new_name)
            return again if found is not None else None

        created = self.created_once(find, lambda: (kube.create(res, namespace, body), again)[1], lost=kube.lost())
        for name in rq.secret_refs(body):  # the copy reads the same Secret: it must outlive the first job too
            kube.own_secret(namespace, name, res, new_name)
        return created


def default_namespace(setting: Callable[[str], Any]) -> str:
    """The namespace of the kubeconfig context in use (``setting`` resolves which: a file read, offline), else the
    pod's, else "default"."""
    found = platform_setting("namespace", setting)
    return str(found[0]) if found else "default"


def job_name(job_id: str, api: str, nodes: int) -> tuple[str, list[str]]:
    """A name the cluster takes (RFC 1035, and short enough for the pods' host names: JobSet names node pods
    <name>-node-0-<i>, the Training Operator <name>-worker-<i>); shortened or prefixed where it is not."""
    notes = []
    suffix = len("-node-0-") if api == "trainjob" else len("-worker-")
    room = 63 - suffix - len(str(max(nodes - 1, 0)))
    # the head gives way: the stamp (and a restart's -rN) keep names unique
    fixed = shortened(job_id if re.match(r"^[a-z]", job_id) else f"j-{job_id}", room)
    if fixed != job_id:
        notes.append(f"kubernetes: the job is named {fixed} (RFC 1035: it starts with a letter, and at most {room} "
                     "characters leave its pods' host names within 63)")
    return fixed, notes


def _nodes(obj: dict[str, Any]) -> int:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "TrainJob":
        return int((spec.get("trainer") or {}).get("numNodes") or 1)
    return sum(int(r.get("replicas") or 0) for r in (spec.get("pytorchReplicaSpecs") or {}).values()) or 1


def node_rank(pod: dict[str, Any]) -> int:
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    index = labels.get("batch.kubernetes.io/job-completion-index") or \
        annotations.get("batch.kubernetes.io/job-completion-index")
    if index is not None:
        return int(index)
    replica = int(labels.get("training.kubeflow.org/replica-index") or 0)
    return replica + (1 if labels.get("training.kubeflow.org/replica-type") == "worker" else 0)


def plan_notes(spec: JobSpec, options: KubernetesOptions, staging: str, prefix: str, target: rq.Target) -> list[str]:
    notes = []
    if target.claim:
        notes.append(f"kubernetes: the bundle travels in {len(target.parts)} ConfigMap(s) mounted on every node; claim "
                     f"{target.claim[0]} is mounted at {rq.SHARED_DIR} (checkpoints and outputs go there)")
    else:
        notes.append(f"kubernetes: submit stages the bundle under {prefix}; each node's first step fetches it with the "
                     "image's storage client and its service account's cloud identity (a TrainJob cannot add an init "
                     "container)")
    if options.api == "trainjob":
        notes.append(f"kubernetes: restarts: a failed or preempted node fails the JobSet, which restarts every node "
                     f"up to the runtime's failurePolicy.maxRestarts (runtime {options.runtime}: a TrainJob cannot set "
                     f"it; `cloudtrain doctor -p kubernetes` compares it with max_restarts {spec.max_restarts}); "
                     "after that the job ends preempted, and `cloudtrain wait --recover` (or `watch`) resubmits it "
                     "to resume")
    else:
        notes.append(f"kubernetes: restarts: the Training Operator restarts failed pods ({options.restart_policy}) up "
                     f"to runPolicy.backoffLimit = max_restarts ({spec.max_restarts})")
    if target.secret:
        notes.append(f"kubernetes: secret variables ({', '.join(target.secret_env)}) go in Secret {target.secret}, "
                     "which the nodes read through secretKeyRef (no value in the job object); it is deleted with "
                     "the job")
    notes.append(f"kubernetes: on preemption or cancel each pod gets SIGTERM and {options.grace_period}s "
                 "(terminationGracePeriodSeconds) to take a final checkpoint and publish it")
    if options.queue:
        notes.append(f"kubernetes: Kueue queue {options.queue}: the job waits suspended until admitted; an eviction "
                     "suspends it again and it resumes from its newest checkpoint when readmitted")
    if spec.spot and not options.node_selector:
        notes.append("kubernetes: spot: set providers.kubernetes.node_selector (and tolerations) to your spot node "
                     "pool, e.g. cloud.google.com/gke-spot: 'true' or eks.amazonaws.com/capacityType: SPOT")
    return notes


def _machine(spec: JobSpec, options: KubernetesOptions) -> Machine:
    asked = [f"{options.cpus_per_node} CPUs" if options.cpus_per_node else "", options.memory or "",
             ", ".join(f"{k}={v}" for k, v in options.node_selector.items())]
    shown = ", ".join(a for a in asked if a)
    return Machine(provider="kubernetes", instance_type="a node of the cluster" + (f" ({shown})" if shown else ""),
                   gpu=spec.accelerator_model, gpus=spec.gpus_per_node, vcpus=options.cpus_per_node or 0)


def _runtime(image: str | None, options: KubernetesOptions) -> Runtime:
    if image in (None, DEFAULT_IMAGE):
        return Runtime(image=image or DEFAULT_IMAGE, torch="2.13.0", python=None, pinned=True,
                       source=f"{options.runtime}'s image in kubeflow/trainer v2.3.0 (a cluster's runtime may differ)")
    return custom(str(image))


def _epoch(text: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() if text else None
    except ValueError:
        return None
