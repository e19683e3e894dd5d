"""Saved plans: ``cloudtrain plan ... -o json > plan.json``, read it (or have it reviewed), then ``cloudtrain submit
--plan plan.json`` submits exactly that plan: the same spec, provider and job id, from the same source.

A plan printed without a saved copy names an example job id: every submit names its job anew (name, UTC time and
random hex), so two submits never collide. A saved plan keeps its id, which also makes submitting it twice one job
(each provider recognises a job it already created from a plan).

What is checked before anything is staged: the file is a cloudtrain plan; it is at most a day old (prices, images
and settings drift); the source bundle built now has the plan's digest (the digest covers the user's source,
cloudtrain itself and the bootstrap, so any change to either is caught). A plan printout never holds secret values
(they are masked); ``--env NAME=VALUE`` supplies the masked environment values again.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import UserError
from cloudtrain.secrets import MASK

if TYPE_CHECKING:
    from cloudtrain.packaging import Package
    from cloudtrain.spec import JobSpec

MAX_AGE = 24 * 3600
_FIELD = "--plan"
_JOB_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # as staging.new_job_id makes them: a name, a path part, a label


@dataclass(frozen=True)
class SavedPlan:
    path: str
    provider: str
    job_id: str
    digest: str
    spec: dict[str, Any]
    created_at: float


def read_saved_plan(path: str) -> SavedPlan:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # missing, unreadable, not UTF-8, not JSON
        raise UserError(f"cannot read {path!r} as a saved plan: {exc}", field=_FIELD,
                        remedy="save one with `cloudtrain plan ... -o json > plan.json`") from None
    try:
        saved = SavedPlan(path=path, provider=data["provider"], job_id=data["job_id"],
                          digest=data["package"]["digest"], spec=data["spec"], created_at=float(data["created_at"]))
        if not all(isinstance(v, str) for v in (saved.provider, saved.job_id, saved.digest)) or \
                not isinstance(saved.spec, dict) or not _JOB_ID.fullmatch(saved.job_id):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path!r} is not a plan saved by this version of cloudtrain (it needs provider, job_id, "
                        "package.digest, spec and created_at)", field=_FIELD,
                        remedy="save one with `cloudtrain plan ... -o json > plan.json`") from None
    age = time.time() - saved.created_at
    if age > MAX_AGE:
        raise UserError(f"{path!r} was planned {age / 3600:.0f} hours ago; a saved plan is good for "
                        f"{MAX_AGE // 3600} hours (prices, images and settings change)", field=_FIELD,
                        remedy="plan again: `cloudtrain plan ... -o json > plan.json`")
    return saved


def _masked(data: Any, where: str = "") -> list[str]:
    if data == MASK:
        return [where]
    if isinstance(data, dict):
        return [m for k, v in data.items() for m in _masked(v, f"{where}.{k}" if where else str(k))]
    if isinstance(data, list):
        return [m for i, v in enumerate(data) for m in _masked(v, f"{where}[{i}]")]
    return []


def saved_spec(saved: SavedPlan, env: dict[str, str]) -> JobSpec:
    """The plan's spec, with the masked environment values taken from ``env`` (``--env NAME=VALUE``)."""
    from cloudtrain.spec import validate_spec

    spec = json.loads(json.dumps(saved.spec))  # a copy
    masked = _masked(spec)
    other = [m for m in masked if not (m.startswith("env.") and "." not in m[4:] and "[" not in m)]
    if other:
        raise UserError(f"{saved.path!r} has masked values in {', '.join(other)}, which --env cannot supply",
                        field=_FIELD, remedy="plan and submit the job directly (`cloudtrain submit ...`)")
    needed = {m[4:] for m in masked}
    missing, extra = sorted(needed - set(env)), sorted(set(env) - needed)
    if missing:
        raise UserError(f"{saved.path!r} holds secret environment values masked: {', '.join(missing)}",
                        field=_FIELD, remedy="pass them again: " + " ".join(f"--env {n}=..." for n in missing))
    if extra:
        raise UserError(f"--env {', '.join(extra)} would change the saved plan (only masked values may be given)",
                        field=_FIELD, remedy="plan again with the new environment")
    spec.setdefault("env", {}).update(env)
    return validate_spec(spec, source=saved.path)


def check_same_source(saved: SavedPlan, package: Package) -> None:
    if package.digest != saved.digest:
        raise UserError(f"the source changed since {saved.path!r} was planned (bundle {saved.digest[:19]} then, "
                        f"{package.digest[:19]} now: a file in source_dir, or cloudtrain itself)", field=_FIELD,
                        remedy="review the change and plan again: `cloudtrain plan ... -o json > plan.json`")
