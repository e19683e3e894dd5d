"""``submit --restore-from N``: a job resumes from checkpoint N on purpose, not from the newest (stdlib only).

It is done to the store, once, when the job is submitted (before any node starts): N becomes the newest checkpoint a
restore takes. Its own set-aside marker (if a failed start left one) is lifted, since it is picked on purpose, and the
usable checkpoints newer than N are set aside as passed over (set_aside.py: never restored, never deleted; the
same flag brings any of them back). So every start of the job restores N until the job publishes a checkpoint of
its own, and every later start (a restart after a preemption, a recovery resubmission, the next plain submit)
resumes from the newest of those, as always: nothing on the nodes knows about N. That is why it is a flag of
``submit`` (and of ``Job.submit``), not a spec field: a spec is used again (the YAML kept, recovery's later legs, a
saved plan), and each use would roll the job back again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cloudtrain.checkpoint import set_aside
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.errors import UserError

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]

FLAG = "--restore-from"


def _quiet(_line: str) -> None:
    pass


def choose(uri: str, step: int, lineage: str | None = None, log: Log = print) -> dict[str, Any]:
    """Make checkpoint ``step`` under ``uri`` the one the next restore takes, as above; ``lineage``: the job's (a
    checkpoint of another job is refused, as the node's restore would). Refuses (UserError, exit 2) a step the store
    does not hold as a checkpoint, saying which it holds. Returns ``{"step", "lifted", "passed_over": [steps]}``."""
    found = checkpoint_store.survey(uri, log=_quiet)
    target = next((c for c in [*found.complete, *found.set_aside] if c.step == step), None)
    if target is None:
        refused = next((r for r in found.refused if r.step == step), None)
        usable = [c.step for c in found.complete]
        listed = f"; usable there: {', '.join(map(str, usable[-10:]))}" if usable else "; it holds no usable checkpoint"
        what = f"checkpoint {step} under {uri} is {refused.kind} ({refused.why})" if refused else \
            f"there is no checkpoint {step} under {uri}"
        raise UserError(f"{what}{listed}", field=FLAG,
                        remedy=f"pick one that `cloudtrain checkpoints {uri}` lists as usable or set aside")
    theirs = target.manifest.get("lineage")
    if lineage and theirs and theirs != lineage:
        raise UserError(f"checkpoint {step} under {uri} belongs to another job (lineage {theirs}, this job is "
                        f"{lineage}): its restore would refuse it", field=FLAG,
                        remedy=f"give this job that job's name, or --env {checkpoint_store.LINEAGE_ENV}={theirs} to "
                               "continue it on purpose")
    newer = [c for c in found.complete if c.step > step]
    others = sorted({str(c.manifest["lineage"]) for c in newer if c.manifest.get("lineage")} - {lineage or ""})
    if lineage and others:  # never another job's checkpoints: that job may still be writing there
        raise UserError(f"checkpoints newer than {step} under {uri} belong to another job (lineage "
                        f"{', '.join(others)}): {FLAG} sets aside only this job's ({lineage})", field=FLAG,
                        remedy="give this job a checkpoint.uri of its own")
    lifted = target in found.set_aside
    if lifted:
        why = set_aside.read(target).reason
        set_aside.lift(target)
        log(f"checkpoint {step} under {uri} was set aside ({why}); picked on purpose, it is usable again")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    for checkpoint in newer:
        set_aside.set_aside(checkpoint, set_aside.PASSED_OVER, f"passed over: submit {FLAG} {step} at {when}")
    if newer:
        log(f"{FLAG} {step}: checkpoint(s) {', '.join(str(c.step) for c in newer)} under {uri} set aside (not "
            f"deleted; {FLAG} brings any back): the job resumes from checkpoint {step}")
    else:
        log(f"{FLAG} {step}: checkpoint {step} is the newest under {uri}: the job resumes from it")
    return {"step": step, "lifted": lifted, "passed_over": [c.step for c in newer]}
