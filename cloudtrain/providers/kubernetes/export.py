"""`plan --export` for Kubernetes: the job as `kubectl apply -f` reads it, and how the bundle gets where the nodes
fetch it (ConfigMaps for a claim, or the files to copy to the bucket)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cloudtrain.bundle.exported import bundle_files, readme
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
from cloudtrain.providers.kubernetes import request as rq

if TYPE_CHECKING:
    from cloudtrain.providers.translation import Planned

COPY = {"s3": "aws s3 cp {src} {dst}", "gs": "gcloud storage cp {src} {dst}",
        "az": "az storage blob upload --file {src} --blob-url {dst}"}


def export(plan: Planned, request: dict[str, Any], folder: Path) -> list[Path]:
    body = request["object"]
    name = f"{body['kind'].lower()}.yaml"
    job = folder / name
    job.write_text(yaml.safe_dump(body, sort_keys=False, width=120))
    written = [job]
    namespace = request["namespace"]
    first = ""  # what `kubectl apply` must create before the job
    if request.get("secret"):
        secret = folder / "secret.yaml"
        secret.write_text(yaml.safe_dump(request["secret"], sort_keys=False, width=120))
        secret.chmod(0o600)
        written.append(secret)
        first = f"kubectl apply -f {secret.name} && "
    if request["configmaps"]:
        target = rq.Target(namespace=namespace, staging=plan.staging["folder"], image=None,
                           digest=plan.package.digest, nproc=None, command=[], env={}, parts=request["configmaps"])
        parts = folder / "configmaps.yaml"
        parts.write_text(yaml.safe_dump_all(rq.configmaps(target, plan.package.bootstrap.read_bytes(),
                                                          plan.package.path.read_bytes()), sort_keys=False))
        written.append(parts)
        command = f"kubectl apply -f {parts.name} && {first}kubectl apply -f {name}"
        how = f"- `{parts.name}`: the bundle in {len(request['configmaps'])} ConfigMap(s), mounted on every node."
    else:
        prefix = plan.staging["prefix"]
        copy = COPY[prefix.split("://", 1)[0]]
        command = " && ".join([*(copy.format(src=f"bundle/{n}", dst=f"{prefix}/{n}") for n in
                                 (BOOTSTRAP_NAME, BUNDLE_NAME, "manifest.json")), f"{first}kubectl apply -f {name}"])
        how = f"- `bundle/`: what every node fetches from `{prefix}/` before it starts (the manifest goes last)."
        written += bundle_files(plan.package, folder / "bundle")
    context = f" (kubectl's context: {request['context']}, `--context`)" if request.get("context") else ""
    guide = readme(folder, f"Kubernetes {body['kind']} {plan.job_id}", command, [
        f"- Namespace {namespace} is in each object's metadata{context}.",
        f"- `{name}`: the {body['kind']} ({body['apiVersion']}) as cloudtrain would create it.",
        *([f"- `secret.yaml`: the Secret {request['secret']['metadata']['name']} with the job's secret variables "
           "(the job reads them through secretKeyRef): it holds their values, keep it private. Once the job "
           "exists, add it to the Secret's ownerReferences if the Secret should go when the job is deleted."]
          if request.get("secret") else []),
        how,
        f"- Follow it: `kubectl -n {namespace} get {body['kind'].lower()} {plan.job_id}`, or "
        f"`cloudtrain status kubernetes://{namespace}/{plan.job_id}`."])
    return [*written, guide]
