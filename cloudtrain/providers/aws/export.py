"""`plan --export` for SageMaker: the CreateTrainingJob request as `aws sagemaker create-training-job` reads it,
and the bundle to stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.bundle.exported import bundle_files, readme
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME

if TYPE_CHECKING:
    from cloudtrain.providers.translation import Planned


def export(plan: Planned, request: dict[str, Any], folder: Path) -> list[Path]:
    target = folder / "create-training-job.json"
    target.write_text(json.dumps(request, indent=2))
    prefix, region = plan.staging["prefix"], plan.staging["region"]
    command = (f"aws s3 cp bundle/{BOOTSTRAP_NAME} {prefix}/{BOOTSTRAP_NAME} && "
               f"aws s3 cp bundle/{BUNDLE_NAME} {prefix}/{BUNDLE_NAME} && "
               f"aws s3 cp bundle/manifest.json {prefix}/manifest.json && "
               f"aws sagemaker create-training-job --region {region} --cli-input-json file://{target.name}")
    guide = readme(folder, f"SageMaker training job {plan.job_id}", command, [
        f"- `{target.name}`: the CreateTrainingJob request cloudtrain would send (secrets included: keep it private).",
        f"- `bundle/`: what the job's `cloudtrain` channel reads from `{prefix}/` (the manifest goes last).",
        "- Then follow it with `cloudtrain logs aws://" + f"{region}/{plan.job_id} -f`."])
    return [target, *bundle_files(plan.package, folder / "bundle"), guide]
