"""The request: a Kubeflow Trainer v2 TrainJob, or a Training Operator v1 PyTorchJob, as plain data (what
`kubectl apply -f` reads), plus the ConfigMaps that carry the bundle when staging is a claim (pvc://), and the Secret
that holds the job's secret variables (the job's env names them through secretKeyRef: no value in the job object)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.node.secret_values import looks_secret
from cloudtrain.providers.kubernetes.node import PYTORCHJOB_PORT
from cloudtrain.providers.kubernetes.options import KubernetesOptions
from cloudtrain.spec.model import JobSpec

TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
MANAGER = "cloudtrain.dev/cloudtrain"  # the runtimePatches manager, and app.kubernetes.io/managed-by
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_JOB = "cloudtrain.dev/job"
ANNOTATION = "cloudtrain.dev/"  # digest, output-uri, checkpoint-uri, max-restarts, cancelled
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ROOT = "/cloudtrain"  # an emptyDir on every node: the fetched bundle and the bootstrap's work folder
BUNDLE_DIR, WORKDIR, PARTS_DIR, SHARED_DIR = f"{ROOT}/bundle", f"{ROOT}/work", f"{ROOT}/parts", f"{ROOT}/shared"
PART_BYTES = 768 * 1024  # a ConfigMap holds at most 1 MiB
MAX_PARTS = 64
FETCH_SOURCE = Path(__file__).with_name("fetch.py")


@dataclass
class Target:
    namespace: str
    staging: str  # the providers.kubernetes.staging URI (or its placeholder)
    image: str | None
    digest: str
    nproc: int | None
    command: list[str]  # python3 -c <fetch> SOURCE DEST -- python3 bootstrap.py ...
    env: dict[str, str]
    parts: list[str] = field(default_factory=list)  # ConfigMap names (pvc:// staging)
    secret: str | None = None  # the Secret that holds env's secret variables (secret_env), if any

    @property
    def secret_env(self) -> dict[str, str]:
        """The variables secret by name or by a value's shape: kept out of the job object."""
        return {name: value for name, value in self.env.items() if looks_secret(name, value)}

    @property
    def claim(self) -> tuple[str, str] | None:
        if not self.staging.startswith("pvc://"):
            return None
        claim, _, path = self.staging[len("pvc://"):].partition("/")
        return claim, path


def part_names(digest: str, size: int) -> list[str]:
    count = max(1, -(-size // PART_BYTES))
    return [f"cloudtrain-bundle-{digest.split(':', 1)[-1][:16]}-{i:03d}" for i in range(count)]


def node_command(python: str, source: str, args: list[str]) -> list[str]:
    return [python, "-c", FETCH_SOURCE.read_text(encoding="utf-8"), source, BUNDLE_DIR, "--", python,
            f"{BUNDLE_DIR}/bootstrap.py", *args]


def metadata(job_id: str, target: Target, options: KubernetesOptions, notes: dict[str, Any]) -> dict[str, Any]:
    labels = {LABEL_MANAGED: "cloudtrain", LABEL_JOB: job_id}
    if options.queue:
        labels[QUEUE_LABEL] = options.queue
    annotations = {ANNOTATION + key: str(value) for key, value in notes.items() if value is not None}
    return {"name": job_id, "namespace": target.namespace, "labels": labels, "annotations": annotations}


def secret_name(job_id: str) -> str:
    return f"{job_id}-env"


def secret(job_id: str, target: Target) -> dict[str, Any] | None:
    """The Secret that carries the job's secret variables (stringData: the API server stores it encoded)."""
    if not target.secret:
        return None
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": target.secret, "namespace": target.namespace,
                         "labels": {LABEL_MANAGED: "cloudtrain", LABEL_JOB: job_id}},
            "stringData": target.secret_env}


def secret_refs(body: dict[str, Any]) -> list[str]:
    """The Secrets a job object's env reads (secretKeyRef), wherever its containers are."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("secretKeyRef")
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                found.add(ref["name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(body.get("spec"))
    return sorted(found)


def _env(target: Target) -> list[dict[str, Any]]:
    hidden = target.secret_env if target.secret else {}
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": target.secret, "key": name}}} if name in hidden
            else {"name": name, "value": value} for name, value in target.env.items()]


def _volumes(target: Target) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [{"name": "cloudtrain", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "cloudtrain", "mountPath": ROOT}]
    if target.claim:
        claim, path = target.claim
        sources = [{"configMap": {"name": name}} for name in target.parts]  # files named by their keys
        volumes += [{"name": "cloudtrain-parts", "projected": {"sources": sources}},
                    {"name": "cloudtrain-shared", "persistentVolumeClaim": {"claimName": claim}}]
        mounts += [{"name": "cloudtrain-parts", "mountPath": PARTS_DIR, "readOnly": True},
                   {"name": "cloudtrain-shared", "mountPath": SHARED_DIR, **({"subPath": path} if path else {})}]
    return volumes, mounts


def resources(spec: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    limits: dict[str, Any] = {options.gpu_resource: spec.gpus_per_node} if spec.gpus_per_node else {}
    requests: dict[str, Any] = dict(limits)
    if options.cpus_per_node:
        requests["cpu"] = str(options.cpus_per_node)
    if options.memory:
        requests["memory"] = options.memory
    return {k: v for k, v in (("limits", limits), ("requests", requests)) if v}


def _pod_extras(spec: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    extras: dict[str, Any] = {"terminationGracePeriodSeconds": options.grace_period}
    if options.node_selector:
        extras["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        extras["tolerations"] = list(options.tolerations)
    if options.service_account:
        extras["serviceAccountName"] = options.service_account
    return extras


def trainjob(spec: JobSpec, options: KubernetesOptions, job_id: str, target: Target,
             notes: dict[str, Any]) -> dict[str, Any]:
    volumes, mounts = _volumes(target)
    trainer: dict[str, Any] = {"command": target.command, "env": _env(target), "numNodes": spec.nodes}
    if target.image:
        trainer["image"] = target.image
    if target.nproc:
        trainer["numProcPerNode"] = target.nproc
    if resources(spec, options):
        trainer["resourcesPerNode"] = resources(spec, options)
    pod = {**_pod_extras(spec, options), "volumes": volumes, "containers": [{"name": "node", "volumeMounts": mounts}]}
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}}
    return {"apiVersion": f"{TRAINJOB[0]}/{TRAINJOB[1]}", "kind": TRAINJOB[3],
            "metadata": metadata(job_id, target, options, notes),
            "spec": {"runtimeRef": {"name": options.runtime, "apiGroup": TRAINJOB[0], "kind": options.runtime_kind},
                     "activeDeadlineSeconds": spec.max_runtime, "trainer": trainer, "runtimePatches": [patch]}}


def pytorchjob(spec: JobSpec, options: KubernetesOptions, job_id: str, target: Target,
               notes: dict[str, Any]) -> dict[str, Any]:
    volumes, mounts = _volumes(target)
    container: dict[str, Any] = {"name": "pytorch", "image": target.image, "command": target.command,
                                 "env": _env(target), "volumeMounts": mounts,
                                 "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}]}
    if resources(spec, options):
        container["resources"] = resources(spec, options)

    def replicas(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": options.restart_policy,
                "template": {"spec": {**_pod_extras(spec, options), "volumes": volumes, "containers": [container]}}}

    specs = {"Master": replicas(1)}
    if spec.nodes > 1:
        specs["Worker"] = replicas(spec.nodes - 1)
    run_policy: dict[str, Any] = {"activeDeadlineSeconds": spec.max_runtime, "backoffLimit": spec.max_restarts,
                                  "cleanPodPolicy": "None"}
    if options.queue:
        run_policy["schedulingPolicy"] = {"queue": options.queue}
    return {"apiVersion": f"{PYTORCHJOB[0]}/{PYTORCHJOB[1]}", "kind": PYTORCHJOB[3],
            "metadata": metadata(job_id, target, options, notes),
            "spec": {"nprocPerNode": str(target.nproc) if target.nproc else "auto", "pytorchReplicaSpecs": specs,
                     "runPolicy": run_policy}}


def configmaps(target: Target, bootstrap: bytes, bundle: bytes) -> list[dict[str, Any]]:
    """The ConfigMaps that carry the bundle to a claim-staged job (content-addressed: one set per digest)."""
    found = []
    for i, name in enumerate(target.parts):
        data = bundle[i * PART_BYTES:(i + 1) * PART_BYTES]
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "namespace": target.namespace,
            "labels": {LABEL_MANAGED: "cloudtrain"},
            "annotations": {ANNOTATION + "digest": target.digest}},
            "binaryData": {f"bundle.part-{i:03d}": base64.b64encode(data).decode()}, "immutable": True}
        if i == 0:
            body["data"] = {"bootstrap.py": bootstrap.decode("utf-8")}
        found.append(body)
    return found
