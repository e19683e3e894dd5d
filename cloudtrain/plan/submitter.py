"""What the core does around every submit (issue 39.1), so a provider's ``_submit`` only sends: a plan that still
holds a placeholder for a setting (the provider's declared ``placeholders``) is refused before anything is staged or
sent; after it is sent, its rate and budget are remembered (`cloudtrain cost`, the budget watcher) and the job's
timeline gets its ``submitted`` and ``staged`` events. ``Provider.submit`` runs it (cloudtrain.plan installs it)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

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
    from cloudtrain.plan.checkpoint_interval import submitted_fields
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
    submitted_at = time.time()
    staging.STAGED.clear()
    handle = provider._submit(plan)
    remember(str(handle), plan)  # its rate and max_cost: what `cloudtrain cost` and the budget watcher price
    timeline.record(str(handle), "submitted", submitted_at, handle=str(handle), provider=provider.name,
                    nodes=plan.spec.nodes, **submitted_fields(plan.spec, plan.notes))
    if staging.STAGED:
        staged = dict(staging.STAGED)
        timeline.record(str(handle), "staged", staged.pop("at"), **staged)
    return handle
