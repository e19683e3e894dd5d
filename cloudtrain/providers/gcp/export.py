"""`plan --export` for Vertex: the CustomJobSpec `gcloud ai custom-jobs create --config` reads, the REST body, and
the bundle to stage."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cloudtrain.bundle.exported import bundle_files, readme
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME

if TYPE_CHECKING:
    from cloudtrain.providers.translation import Planned


def export(plan: Planned, request: dict[str, Any], folder: Path) -> list[Path]:
    job = request["customJob"]
    body = folder / "custom-job.json"
    body.write_text(json.dumps(job, indent=2))
    spec = folder / "custom-job-spec.yaml"
    spec.write_text(yaml.safe_dump(job["jobSpec"], sort_keys=False))
    prefix, project, region = plan.staging["prefix"], plan.staging["project"], plan.staging["region"]
    labels = ",".join(f"{k}={v}" for k, v in job.get("labels", {}).items())
    command = (f"gcloud storage cp bundle/{BOOTSTRAP_NAME} bundle/{BUNDLE_NAME} {prefix}/ && "
               f"gcloud storage cp bundle/manifest.json {prefix}/ && "
               f"gcloud ai custom-jobs create --project={project} --region={region} "
               f"--display-name={shlex.quote(job['displayName'])} --labels={labels} --config={spec.name}")
    guide = readme(folder, f"Vertex AI custom job {plan.job_id}", command, [
        f"- `{spec.name}`: the CustomJobSpec `gcloud ai custom-jobs create --config` reads (secrets included: keep it "
        "private).",
        f"- `{body.name}`: the same job as the REST body of "
        f"`POST https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}/customJobs`.",
        f"- `bundle/`: what every node reads from `{prefix}/` through Vertex's /gcs mount (the manifest goes last).",
        "- Vertex names the job with a number: `cloudtrain list --provider gcp` shows its handle."])
    return [spec, body, *bundle_files(plan.package, folder / "bundle"), guide]
