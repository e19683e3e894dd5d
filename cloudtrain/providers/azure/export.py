"""`plan --export` for Azure ML: the command job YAML `az ml job create --file` reads, with its code folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cloudtrain.bundle.exported import bundle_files, readme

if TYPE_CHECKING:
    from cloudtrain.providers.translation import Planned


def unset(plan: Planned) -> list[str]:
    """What the files would lack: the workspace, when the plan could not name one offline."""
    missing = "providers.azure.workspace (with subscription_id and resource_group)"
    return [] if "workspace" in plan.staging else [missing]


def export(plan: Planned, request: dict[str, Any], folder: Path) -> list[Path]:
    job = dict(request["job"])
    target = folder / "job.yaml"
    target.write_text(yaml.safe_dump(job, sort_keys=False))
    code = bundle_files(plan.package, folder / Path(job["code"]).name)
    sub, group, workspace = plan.staging["workspace"].split("/")
    command = (f"az ml job create --file {target.name} --subscription {sub} --resource-group {group} "
               f"--workspace-name {workspace}")
    guide = readme(folder, f"Azure ML command job {plan.job_id}", command, [
        f"- `{target.name}`: the command job (secrets included: keep it private); `{job['code']}` is its code "
        "folder, uploaded by `az ml job create`.",
        f"- Then follow it with `cloudtrain logs azure://{sub}/{group}/{workspace}/{plan.job_id} -f`."])
    return [target, *code, guide]
