"""`cloudtrain doctor` for Slurm: the client programs on PATH and answering, the partition a plan would use, and a
staging folder this machine can write (the nodes must see it at the same path: a shared filesystem)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from cloudtrain.doctor import PLACEHOLDER, Check, Context, setting, setting_check

PROGRAMS = ("sbatch", "srun", "squeue", "scontrol", "scancel")


def checks(ctx: Context) -> list[Check]:
    found = [_programs(ctx)]
    if found[0].status == "ok":
        found.append(_partition(ctx))
    found.append(_staging(ctx))
    return found


def _path(ctx: Context) -> str | None:
    return ctx.env.get("PATH") or os.environ.get("PATH")


def _programs(ctx: Context) -> Check:
    missing = [p for p in PROGRAMS if shutil.which(p, path=_path(ctx)) is None]
    if missing:
        return Check("slurm", "commands", "missing", f"{', '.join(missing)} not on PATH",
                     "run cloudtrain on a login node of the cluster (where sbatch works), or add Slurm's client "
                     "programs to PATH")
    done = _run(ctx, ["sbatch", "--version"])
    return Check("slurm", "commands", "ok", (done.stdout.strip() if done else "") or "sbatch found")


def _partition(ctx: Context) -> Check:
    done = _run(ctx, ["sinfo", "--noheader", "--format=%R|%a"])
    if done is None or done.returncode != 0:
        why = done.stderr.strip()[-300:] if done else "sinfo did not answer"
        return Check("slurm", "partition", "missing", f"the cluster does not answer: {why}",
                     "check SLURM_CONF and that slurmctld runs (`scontrol ping`)")
    available = dict(line.split("|", 1) for line in done.stdout.split() if "|" in line)
    wanted = setting(ctx, "slurm", "partition")
    if wanted is None:
        return Check("slurm", "partition", "ok", f"the cluster's default (partitions: {', '.join(available)})")
    if wanted[0] not in available:
        return Check("slurm", "partition", "missing", f"{wanted[0]} ({wanted[1]}) is not a partition of this "
                                                      f"cluster: {', '.join(available) or 'none'}",
                     "set providers.slurm.partition to one of them (`sinfo` lists them)")
    state = available[wanted[0]]
    return Check("slurm", "partition", "ok" if state == "up" else "warn", f"{wanted[0]} ({wanted[1]}), {state}")


def _staging(ctx: Context) -> Check:
    found = setting(ctx, "slurm", "staging")
    if found is None:
        return setting_check(ctx, "slurm", "staging", "staging folder", PLACEHOLDER, "/shared/$USER/cloudtrain")
    folder = Path(found[0])
    parent = next((p for p in [folder, *folder.parents] if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK | os.X_OK):
        return Check("slurm", "staging", "missing", f"{folder} ({found[1]}) is not writable here",
                     f"choose a folder you can write on the shared filesystem, or `chmod u+w {parent}`")
    return Check("slurm", "staging", "ok", f"{folder} ({found[1]}, writable; the nodes must see it at this path)")


def _run(ctx: Context, argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=15, env={**os.environ, **ctx.env})
    except (OSError, subprocess.TimeoutExpired):
        return None
