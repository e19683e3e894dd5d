"""What the core does around every submit (issue 39.1), so a provider's ``_submit`` only sends: a plan that still
holds a placeholder for a setting (the provider's declared ``placeholders``) is refused before anything is staged or
sent, and so is one whose checkpoint URI a live job of another lineage holds (check_checkpoint_uri); after it is
sent, its rate and budget are remembered (`cloudtrain cost`, the budget watcher) and the job's
timeline gets its ``submitted`` and ``staged`` events. ``Provider.submit`` runs it (cloudtrain.plan installs it)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import UserError
from cloudtrain.plan.model import Plan

if TYPE_CHECKING:
    from cloudtrain.handles import JobHandle
    from cloudtrain.providers.base import Provider
    from cloudtrain.providers.translation import Planned


def submit(provider: Provider, planned: Planned) -> JobHandle:
    """Send ``planned`` through ``provider._submit``, with the checks before and the records after."""
    from cloudtrain.bundle import staging
    from cloudtrain.home import timeline
    from cloudtrain.plan.checkpoint_interval import measured_key, submitted_fields
    from cloudtrain.plan.cost import remember
    from cloudtrain.plan.export import unset_settings

    assert isinstance(planned, Plan), f"a plan to submit is a cloudtrain Plan, not {type(planned).__name__}"
    plan = planned
    for setting in unset_settings(plan):
        variables = provider.declaration.env.get(setting.rsplit(".", 1)[1], ())
        raise UserError("is not set: the plan holds a placeholder", field=setting,
                        remedy=f"set {setting} in the spec (or --set {setting}=...)"
                               + (f", or {variables[0]}" if variables else "")
                               + f", or `cloudtrain config set {setting.removeprefix('providers.')} ...`")
    check_checkpoint_uri(plan)
    submitted_at = time.time()
    staging.STAGED.clear()
    handle = provider._submit(plan)
    remember(str(handle), plan)  # its rate and max_cost: what `cloudtrain cost` and the budget watcher price
    # the provider, machine, nodes, spot and name: what the job's runs measure (checkpoint.interval: auto)
    timeline.record(str(handle), "submitted", submitted_at, handle=str(handle), **measured_key(plan),
                    **submitted_fields(plan.spec, plan.notes))
    if staging.STAGED:
        staged = dict(staging.STAGED)
        timeline.record(str(handle), "staged", staged.pop("at"), **staged)
    return handle


def check_checkpoint_uri(plan: Plan) -> None:
    """One live job writes to a checkpoint URI (cloudtrain/checkpoint/writer.py): a live job of another lineage that
    holds the plan's refuses this submit (exit 2), before anything is staged or sent, unless the plan takes it over;
    a note says where this submission will take the URI over. A store this machine cannot read is said, and the
    job's node 0 checks again when it starts."""
    from cloudtrain import contract
    from cloudtrain.bundle.staging import lineage_id
    from cloudtrain.checkpoint import writer

    uri = plan.spec.checkpoint.uri
    if not uri:
        return
    me = writer.Identity(plan.job_id, plan.spec.env.get(contract.LINEAGE) or lineage_id(plan.spec),
                         bool(plan.spec.checkpoint.take_over))
    try:
        note = writer.before_submit(uri, me, cancel=_cancel_command)
    except writer.UriHeld:
        raise
    except Exception as exc:  # any store client's error: the node checks again
        note = f"could not read who holds the checkpoint URI {uri} ({exc}); the job's node 0 checks when it starts"
    if note:
        print(f"note: {note}", file=sys.stderr)


def _cancel_command(held: dict[str, Any]) -> str | None:
    """`cloudtrain cancel HANDLE` for the job holding a lease, where this machine submitted it (its timeline)."""
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.home.timeline import known_handles

    job = held.get("job")
    try:
        found = [h for h in known_handles() if job and h.rsplit("/", 1)[-1] == job]
    except (CloudtrainError, OSError):
        return None
    return f"`cloudtrain cancel {found[0]}`" if found else None
