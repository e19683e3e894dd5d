"""Saved plans: ``cloudtrain plan ... -o json > plan.json``, read it (or have it reviewed), then ``cloudtrain submit
--plan plan.json`` submits exactly that plan: the same spec, provider and job id, from the same source.

A plan printed without a saved copy names an example job id: every submit names its job anew (name, UTC time and
random hex), so two submits never collide. A saved plan keeps its id, which also makes submitting it twice one job
(each provider recognises a job it already created from a plan).

What is checked before anything is staged: the file is a cloudtrain plan; it is at most a day old (prices, images
and settings drift) and not dated ahead of this clock (a machine whose clock ran ahead made it: it would never age);
the source bundle built now has the plan's digest (the digest covers the user's source, cloudtrain itself and the
bootstrap, so any change to either is caught). A plan printout never holds secret values (they are masked);
``--env NAME=VALUE`` supplies the masked environment values again. A plan saved for a provider list (``plan -p
aws,gcp -o json``: its legs, each with its plan) is checked leg by leg and as a whole (the legs' order); a leg
whose provider was not installed where it was planned holds no plan, and is skipped.

A saved plan is what runs, or it is refused. The printed plan carries a digest of each of its parts (``seal``: the
spec's fields, the request's, each node's command ...); submit checks them, so an edit (a spec argument, a node
command, the request shown for review) is refused naming the part that changed. The job is then planned again from
the saved spec and must come out as the file shows it (request, nodes, spec, package, staging, image): what is
submitted is what was reviewed, or nothing is; only what never ships (the names of files left out of the package:
another plan saved in the project since) may differ. A file that is not a regular file, too large, nested too deep or
otherwise not a plan is refused the same way (exit 2, no traceback).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import SpecError, UserError
from cloudtrain.node.durations import format_duration
from cloudtrain.node.secret_values import MASK
from cloudtrain.plan.seal import SEAL, seal_parts
from cloudtrain.regular_files import read_bytes

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.plan.model import Plan
    from cloudtrain.providers.base import Provider
    from cloudtrain.spec.model import JobSpec

MAX_AGE = 24 * 3600
CLOCK_SKEW = 300  # seconds a plan may be dated ahead of this clock: two machines' clocks differ a little
MAX_BYTES = 64 * 1024 * 1024  # a plan is kilobytes (its file list grows with the source): far more is not one
# What the job runs, compared between the saved plan and the plan made again at submit (created_at, notes and
# spec_file may differ: the time, and the file the spec now comes from).
BOUND = ("provider", "job_id", "request", "package", "staging", "image", "runtime", "machine", "nodes", "spec")
UNBOUND_PACKAGE = ("left_out",)  # the package's fields that name files which do not ship
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
    data: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole document


def read_document(path: str) -> Any:
    """The JSON document at ``path``, refused (exit 2) where it is not one a plan could be."""
    try:
        raw = read_bytes(path, MAX_BYTES + 1)  # never a FIFO: opening one would wait for a writer
        if len(raw) > MAX_BYTES:
            raise ValueError(f"more than {MAX_BYTES // (1024 * 1024)} MB, far more than a plan")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # missing, a FIFO, not UTF-8, not JSON, nested too deep
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise UserError(f"cannot read {path!r} as a saved plan: {why}", field=_FIELD,
                        remedy="save one with `cloudtrain plan ... -o json > plan.json`") from None
    _check_shape(data, path)
    return data


def read_saved_plan(path: str) -> SavedPlan:
    return saved_plan_of(read_document(path), path)


def saved_plan_of(data: Any, path: str, where: str = "") -> SavedPlan:
    """The plan ``data`` read from ``path`` (``where``: its place in the file, ``legs[1].plan.``), checked: a
    cloudtrain plan, dated neither over a day ago nor ahead of this clock, and as it was planned."""
    try:
        saved = SavedPlan(path=path, provider=data["provider"], job_id=data["job_id"],
                          digest=data["package"]["digest"], spec=data["spec"], created_at=float(data["created_at"]),
                          data=data)
        if not all(isinstance(v, str) for v in (saved.provider, saved.job_id, saved.digest)) or \
                not isinstance(saved.spec, dict) or not _JOB_ID.fullmatch(saved.job_id) or \
                not math.isfinite(saved.created_at) or not isinstance(data.get(SEAL), dict):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path!r} is not a plan saved by this version of cloudtrain ({where.rstrip('.') or 'it'} "
                        "needs provider, job_id, package.digest, spec, created_at and seal)", field=_FIELD,
                        remedy="save one with `cloudtrain plan ... -o json > plan.json`") from None
    age = time.time() - saved.created_at
    if age > MAX_AGE:
        raise UserError(f"{path!r} was planned {age / 3600:.0f} hours ago; a saved plan is good for "
                        f"{MAX_AGE // 3600} hours (prices, images and settings change)", field=_FIELD,
                        remedy="plan again: `cloudtrain plan ... -o json > plan.json`")
    _refuse_changes(path, [where + part for part in _changed_parts(data)])
    if -age > CLOCK_SKEW:  # planned on a machine whose clock ran ahead: such a plan would never grow old
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(saved.created_at))
        ahead = format_duration(round(-age / 60) * 60)
        raise UserError(f"{path!r} is dated {when} ({where}created_at), {ahead} ahead of this machine's clock: a "
                        "plan is not made in the future", field=_FIELD,
                        remedy="set the clock right on the machine that planned it (or on this one: `date -u` shows "
                               "it), then plan again: `cloudtrain plan ... -o json > plan.json`")
    return saved


def saved_legs_of(data: dict[str, Any], path: str) -> list[tuple[dict[str, Any], SavedPlan | None]]:
    """A plan saved for a provider list (`plan -p local,slurm -o json`): each leg (provider, region) and its plan,
    each checked as a plan on its own; the list's own seal binds the legs' order. A leg whose provider was not
    installed where the list was planned holds no plan, only ``not_installed`` (its message and remedy, kept in
    the leg's dict): None in its place, and submit skips it (nothing unreviewed runs)."""
    legs = data.get("legs")
    if not isinstance(legs, list) or not legs or not isinstance(data.get(SEAL), dict) or \
            not all(isinstance(leg, dict) and (isinstance(leg.get("plan"), dict) or _not_installed(leg))
                    for leg in legs):
        raise UserError(f"{path!r} is not a plan for a provider list saved by this version of cloudtrain (it needs "
                        "legs, each with provider, region and plan, and seal)", field=_FIELD,
                        remedy="save one with `cloudtrain plan -p PROVIDER,PROVIDER ... -o json > plan.json`")
    found = [({"provider": leg.get("provider"), "region": leg.get("region"),
               **({} if isinstance(leg.get("plan"), dict) else {"not_installed": leg["not_installed"]})},
              saved_plan_of(leg["plan"], path, f"legs[{n}].plan.") if isinstance(leg.get("plan"), dict) else None)
             for n, leg in enumerate(legs)]
    _refuse_changes(path, _changed_parts(data) + [f"legs[{n}].provider" for n, (leg, plan) in enumerate(found)
                                                  if plan is not None and leg["provider"] != plan.provider])
    return found


def _not_installed(leg: dict[str, Any]) -> bool:
    """A saved leg with no plan: its provider was not installed where the list was planned (named, with the fix)."""
    found = leg.get("not_installed")
    return "plan" not in leg and isinstance(leg.get("provider"), str) and isinstance(found, dict) and \
        all(isinstance(found.get(key), str) for key in ("message", "remedy"))


def common_spec(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the legs' specs agree on: the job as the user gave it, without what each leg's provider filled in for
    itself (its region, its output folder, its settings), which a later leg fills in for itself again."""
    def common(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            both = {k: common(a[k], b[k]) for k in a if k in b}
            return {k: v for k, v in both.items() if v is not _DIFFERS}
        return a if a == b else _DIFFERS

    found = specs[0]
    for spec in specs[1:]:
        found = common(found, spec)
    return found


_DIFFERS = object()


def _check_shape(data: Any, path: str) -> None:
    from cloudtrain.spec.files import MAX_NODES, check_shape

    try:
        check_shape(data, repr(path), max_depth=64, max_nodes=10 * MAX_NODES)
    except SpecError as exc:
        raise UserError(f"{exc.message}: not a saved plan", field=_FIELD,
                        remedy="save one with `cloudtrain plan ... -o json > plan.json`") from None


def _refuse_changes(path: str, changed: list[str]) -> None:
    if changed:
        raise UserError(f"{path!r} was changed after it was planned: {_named(changed)} "
                        f"{'differs' if len(changed) == 1 else 'differ'} from what was planned", field=_FIELD,
                        remedy="plan again and review that plan (`cloudtrain plan ... -o json > plan.json`): a saved "
                               "plan is submitted exactly as planned, or not at all")


def _changed_parts(data: dict[str, Any]) -> list[str]:
    seal, now = data[SEAL], seal_parts(data)
    return sorted(name for name in set(now) | set(seal) if now.get(name) != seal.get(name))


def _named(parts: list[str], limit: int = 6) -> str:
    return ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more" if len(parts) > limit else "")


def check_replanned(saved: SavedPlan, now: dict[str, Any]) -> None:
    """The plan made again at submit (``now``, redacted as the file is) must be the saved one in all that the job
    runs; else refused, naming where it differs."""
    differs = [path for key in BOUND for path in _differences(_bound(saved.data, key), _bound(now, key), key)]
    if differs:
        raise UserError(f"{saved.path!r} no longer plans as it shows: {_named(differs)} would differ (cloudtrain, "
                        "its settings or catalog changed since it was planned)", field=_FIELD,
                        remedy="plan again and review that plan (`cloudtrain plan ... -o json > plan.json`)")


def _bound(plan: dict[str, Any], key: str) -> Any:
    """What of ``plan[key]`` the job runs. Of the package, not what was left out of it: the files that never ship
    (another plan saved in the project since, an export) change nothing the digest and file list do not show."""
    value = plan.get(key)
    if key == "package" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in UNBOUND_PACKAGE}
    return value


def _differences(old: Any, new: Any, where: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new), key=str)
        return [p for k in keys for p in _differences(old.get(k), new.get(k), f"{where}.{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in _differences(a, b, f"{where}[{i}]")]
    return [] if old == new else [where]


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
    from cloudtrain.spec.model import validate_spec

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


@contextmanager
def replanned(saved: SavedPlan, env: dict[str, str], provider: str | Provider) -> Iterator[Plan]:
    """The saved plan made again (its job id, its spec with the masked values from ``env``), refused unless it is
    the plan the file shows: the same source, and the same in all that the job runs. Closed on leaving."""
    from cloudtrain.bundle.staging import saved_job_id
    from cloudtrain.plan.planner import plan_job

    spec = saved_spec(saved, env)
    with saved_job_id(saved.job_id):
        plan = plan_job(spec, provider, spec_file=saved.path)
    with plan:
        check_same_source(saved, plan.package)
        check_replanned(saved, plan.to_dict())
        yield plan


def check_same_source(saved: SavedPlan, package: Package) -> None:
    if package.digest != saved.digest:
        raise UserError(f"the source changed since {saved.path!r} was planned (bundle {saved.digest[:19]} then, "
                        f"{package.digest[:19]} now: a file in source_dir, or cloudtrain itself)", field=_FIELD,
                        remedy="review the change and plan again: `cloudtrain plan ... -o json > plan.json`")
