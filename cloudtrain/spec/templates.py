"""``cloudtrain init``: starter specs from templates/, plus the matching reference trainer when none exists."""

from __future__ import annotations

import shutil
from pathlib import Path

from cloudtrain.errors import UserError
from cloudtrain.home.paths import resource_dir
from cloudtrain.regular_files import special
from cloudtrain.spec.model import SPEC_FILENAME, load_spec

TRAINERS = {"ddp": "train_ddp.py", "fsdp": "train_fsdp.py"}


def template_names() -> list[str]:
    return sorted(p.stem for p in resource_dir("templates").glob("*.yaml"))


# The templates' checkpoint folder, replaced by one inside the project (.cloudtrain/, which is never packaged): a
# shared /tmp folder would let a new project resume another project's run of the same name.
_TEMPLATE_CHECKPOINTS = "file:///tmp/cloudtrain-checkpoints/"


def _for_project(text: str, target_dir: Path) -> str:
    folder = (target_dir.resolve() / ".cloudtrain" / "checkpoints").as_uri()
    return text.replace(_TEMPLATE_CHECKPOINTS, folder + "/")


def write_starter(template: str, target_dir: Path, force: bool = False) -> list[Path]:
    source = resource_dir("templates") / f"{template}.yaml"
    if not source.is_file():
        raise UserError(f"no template {template!r}", field="--template",
                        remedy="choose one of: " + ", ".join(template_names()))
    if not target_dir.is_dir():
        raise UserError(f"folder {str(target_dir)!r} does not exist", field="--dir", remedy="create it first")
    spec_path = target_dir / SPEC_FILENAME
    kind = special(spec_path)
    if kind:  # writing into a FIFO waits for a reader: never opened, even with --force
        raise UserError(f"{spec_path} is {kind}, not a regular file", field="--dir",
                        remedy="remove it, or pass --dir to write elsewhere")
    if spec_path.exists() and not force:
        raise UserError(f"{spec_path} already exists", field="--force",
                        remedy="pass --force to overwrite it, or --dir to write elsewhere")
    written = [spec_path]
    spec_path.write_text(_for_project(source.read_text(encoding="utf-8"), target_dir), encoding="utf-8")
    spec = load_spec(spec_path)  # a template that does not validate is a bug here, not the user's problem
    trainer = target_dir / str(spec.script)
    if template in TRAINERS and not trainer.exists():
        shutil.copyfile(resource_dir("entrypoints") / TRAINERS[template], trainer)
        written.append(trainer)
    return written
