"""``cloudtrain plan ... --export DIR``: the plan as files each platform's own tools accept as they are, written
after the plan is made (the plan itself stays pure), with a README naming the one command that submits them.

    aws    create-training-job.json (``aws sagemaker create-training-job --cli-input-json``) + bundle/ to stage
    azure  job.yaml + code/ (``az ml job create --file job.yaml``)
    gcp    custom-job-spec.yaml (``gcloud ai custom-jobs create --config``), custom-job.json (the REST body) + bundle/

The files hold the request as it would be sent, secrets included (it must run as is): they are written readable by
their owner only.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cloudtrain.errors import UserError
from cloudtrain.packaging import BOOTSTRAP_NAME, BUNDLE_NAME

if TYPE_CHECKING:
    from cloudtrain.plan import Plan


def export(plan: Plan, folder: Path) -> list[Path]:
    """Write ``plan`` into ``folder`` (new or empty); returns the files written."""
    if plan.provider not in _WRITERS:
        raise UserError(f"--export writes cloud artifacts; provider {plan.provider!r} has none",
                        field="--export", remedy="use --provider aws, azure or gcp")
    from cloudtrain.providers.aws import request as aws
    from cloudtrain.providers.gcp import request as gcp

    placeholders = {"providers.aws.role": aws.PLACEHOLDER_ROLE, "providers.aws.bucket": aws.PLACEHOLDER_BUCKET,
                    "providers.gcp.project": gcp.PLACEHOLDER_PROJECT, "providers.gcp.bucket": gcp.PLACEHOLDER_BUCKET}
    sent = json.dumps(plan.request) + json.dumps(plan.staging)
    unset = [field for field, marker in placeholders.items() if marker in sent]
    if plan.provider == "azure" and "workspace" not in plan.staging:
        unset.append("providers.azure.workspace (with subscription_id and resource_group)")
    if unset:
        raise UserError(f"the plan holds placeholders for {', '.join(unset)}: its files would not run as they are",
                        field="--export", remedy="set them in the spec (or --set, `cloudtrain config set ...`), "
                                                 "then export again")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} exists and is not an empty folder", field="--export",
                        remedy="name a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    request = plan.to_dict(redact=False)["request"]
    written = _WRITERS[plan.provider](plan, request, folder)
    for path in written:
        path.chmod(0o600 if path.suffix in (".json", ".yaml") else 0o644)
    return written


def _bundle(plan: Plan, folder: Path) -> list[Path]:
    """What a node needs: bootstrap.py, bundle.tar.gz and manifest.json (staged last: it marks the prefix whole)."""
    folder.mkdir()
    shutil.copyfile(plan.package.bootstrap, folder / BOOTSTRAP_NAME)
    shutil.copyfile(plan.package.path, folder / BUNDLE_NAME)
    (folder / "manifest.json").write_text(json.dumps(plan.package.manifest(), indent=1))
    return [folder / BOOTSTRAP_NAME, folder / BUNDLE_NAME, folder / "manifest.json"]


def _readme(folder: Path, title: str, command: str, details: list[str]) -> Path:
    text = "\n".join([f"# {title}", "", "Run, in this folder:", "", "```bash", command, "```", "", *details, ""])
    (folder / "README.md").write_text(text)
    return folder / "README.md"


def _aws(plan: Plan, request: dict[str, Any], folder: Path) -> list[Path]:
    target = folder / "create-training-job.json"
    target.write_text(json.dumps(request, indent=2))
    prefix, region = plan.staging["prefix"], plan.staging["region"]
    command = (f"aws s3 cp bundle/{BOOTSTRAP_NAME} {prefix}/{BOOTSTRAP_NAME} && "
               f"aws s3 cp bundle/{BUNDLE_NAME} {prefix}/{BUNDLE_NAME} && "
               f"aws s3 cp bundle/manifest.json {prefix}/manifest.json && "
               f"aws sagemaker create-training-job --region {region} --cli-input-json file://{target.name}")
    readme = _readme(folder, f"SageMaker training job {plan.job_id}", command, [
        f"- `{target.name}`: the CreateTrainingJob request cloudtrain would send (secrets included: keep it private).",
        f"- `bundle/`: what the job's `cloudtrain` channel reads from `{prefix}/` (the manifest goes last).",
        "- Then follow it with `cloudtrain logs aws://" + f"{region}/{plan.job_id} -f`."])
    return [target, *_bundle(plan, folder / "bundle"), readme]


def _azure(plan: Plan, request: dict[str, Any], folder: Path) -> list[Path]:
    job = dict(request["job"])
    target = folder / "job.yaml"
    target.write_text(yaml.safe_dump(job, sort_keys=False))
    code = _bundle(plan, folder / Path(job["code"]).name)
    sub, group, workspace = plan.staging["workspace"].split("/")
    command = (f"az ml job create --file {target.name} --subscription {sub} --resource-group {group} "
               f"--workspace-name {workspace}")
    readme = _readme(folder, f"Azure ML command job {plan.job_id}", command, [
        f"- `{target.name}`: the command job (secrets included: keep it private); `{job['code']}` is its code "
        "folder, uploaded by `az ml job create`.",
        f"- Then follow it with `cloudtrain logs azure://{sub}/{group}/{workspace}/{plan.job_id} -f`."])
    return [target, *code, readme]


def _gcp(plan: Plan, request: dict[str, Any], folder: Path) -> list[Path]:
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
    readme = _readme(folder, f"Vertex AI custom job {plan.job_id}", command, [
        f"- `{spec.name}`: the CustomJobSpec `gcloud ai custom-jobs create --config` reads (secrets included: keep it "
        "private).",
        f"- `{body.name}`: the same job as the REST body of "
        f"`POST https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}/customJobs`.",
        f"- `bundle/`: what every node reads from `{prefix}/` through Vertex's /gcs mount (the manifest goes last).",
        "- Vertex names the job with a number: `cloudtrain list --provider gcp` shows its handle."])
    return [spec, body, *_bundle(plan, folder / "bundle"), readme]


_WRITERS = {"aws": _aws, "azure": _azure, "gcp": _gcp}

