"""`cloudtrain doctor` for the toy scheduler: its spool folder, and the queue plans would use."""

from __future__ import annotations

import os
from pathlib import Path

from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import PLACEHOLDER, Context, setting_check


def checks(ctx: Context) -> list[Check]:
    spool = Path(ctx.env.get("CLOUDTRAIN_HOME") or ctx.home / ".cloudtrain") / "toy-spool"
    parent = next((p for p in [spool, *spool.parents] if p.exists()), Path("/"))
    writable = Check("toy", "spool", "ok", f"{spool} (writable)") if os.access(parent, os.W_OK) else \
        Check("toy", "spool", "missing", f"{spool} is not writable", f"chmod u+w {parent}")
    return [writable, setting_check(ctx, "toy", "queue", "queue", PLACEHOLDER, "QUEUE")]
