"""``cloudtrain plan ... --export DIR``: the plan as files each platform's own tools accept as they are, written
after the plan is made (the plan itself stays pure), with a README naming the one command that submits them. What
the files are is each provider's (``export.py`` in its folder, ``export`` in its registry entry), e.g.

    aws    create-training-job.json (``aws sagemaker create-training-job --cli-input-json``) + bundle/ to stage
    azure  job.yaml + code/ (``az ml job create --file job.yaml``)
    gcp    custom-job-spec.yaml (``gcloud ai custom-jobs create --config``), custom-job.json (the REST body) + bundle/

The files hold the request as it would be sent, secrets included (it must run as is): they are written readable by
their owner only, and the folder is marked (``.cloudtrain-export``, written first) so that no bundle ships it when
it lies inside a project.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain import registry
from cloudtrain.bundle.packaging import EXPORT_MARKER
from cloudtrain.errors import UserError

if TYPE_CHECKING:
    from cloudtrain.plan.model import Plan


def export(plan: Plan, folder: Path) -> list[Path]:
    """Write ``plan`` into ``folder`` (new or empty); returns the files written."""
    decl = registry.declaration(plan.provider)
    if not decl.export:
        with_export = [d.name for d in registry.declarations().values() if d.export]
        raise UserError(f"--export writes a platform's own files; provider {plan.provider!r} has none",
                        field="--export", remedy=f"use --provider {' or '.join(with_export)}")
    writer = decl.load("export")  # a module: export(plan, request, folder), and unset(plan) where it has more to say
    unset = unset_settings(plan) + (writer.unset(plan) if hasattr(writer, "unset") else [])
    if unset:
        raise UserError(f"the plan holds placeholders for {', '.join(unset)}: its files would not run as they are",
                        field="--export", remedy="set them in the spec (or --set, `cloudtrain config set ...`), "
                                                 "then export again")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} exists and is not an empty folder", field="--export",
                        remedy="name a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / EXPORT_MARKER).write_text("Written by `cloudtrain plan --export`: the files here hold the job's request "
                                        "with its secrets in clear, so cloudtrain never packages this folder.\n")
    request = plan.to_dict(redact=False)["request"]
    written: list[Path] = writer.export(plan, request, folder)
    for path in written:
        path.chmod(0o600 if path.suffix in (".json", ".yaml") else 0o644)
    return written


def unset_settings(plan: Plan) -> list[str]:
    """The settings whose placeholder (the provider's ``placeholders``) the plan still holds."""
    decl = registry.declaration(plan.provider)
    sent = json.dumps(plan.request) + json.dumps(plan.staging)
    unset = [f"providers.{plan.provider}.{key}" for key, marker in decl.placeholders.items() if marker in sent]
    return unset
