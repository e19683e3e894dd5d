"""`cloudtrain doctor` for Slurm: sbatch on PATH and answering (or the login host reachable over SSH and sbatch
answering there), the partition a plan would use, and a staging folder that can be written (the nodes must see it at
the same path: a shared filesystem)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import PLACEHOLDER, Context, setting, setting_check
from cloudtrain.providers.slurm.clients import SSH_ENV

PROGRAMS = ("sbatch", "srun", "squeue", "scontrol", "scancel")


def checks(ctx: Context) -> list[Check]:
    login = setting(ctx, "slurm", "login")
    found = [_login(ctx, login[0]) if login else _programs(ctx)]
    if found[0].status == "ok":
        found.append(_partition(ctx, login[0] if login else None))
    found.append(_staging(ctx, login[0] if login else None))
    return found


def _programs(ctx: Context) -> Check:
    path = ctx.env.get("PATH") or os.environ.get("PATH")
    missing = [p for p in PROGRAMS if shutil.which(p, path=path) is None]
    if missing:
        return Check("slurm", "commands", "missing", f"{', '.join(missing)} not on PATH",
                     "run cloudtrain on a login node of the cluster (where sbatch works), set providers.slurm.login "
                     "to reach one over SSH, or add Slurm's client programs to PATH")
    done = _run(ctx, None, ["sbatch", "--version"])
    return Check("slurm", "commands", "ok", (done.stdout.strip() if done else "") or "sbatch found")


def _login(ctx: Context, login: str) -> Check:
    done = _run(ctx, login, ["sbatch", "--version"])
    if done is None or done.returncode != 0:
        why = (done.stderr.strip()[-300:] or f"exit {done.returncode}") if done else "ssh did not answer"
        return Check("slurm", "login", "missing", f"`ssh {login} sbatch --version` failed: {why}",
                     f"make `ssh {login} sbatch --version` work without a password (a key or an agent), or unset "
                     "providers.slurm.login on a login node")
    return Check("slurm", "login", "ok", f"{login}: {done.stdout.strip()}")


def _partition(ctx: Context, login: str | None) -> Check:
    done = _run(ctx, login, ["sinfo", "--noheader", "--format=%R|%a"])
    if done is None or done.returncode != 0:
        # sinfo explains its failure over several lines; the last one says what failed
        why = (done.stderr.strip().splitlines() or ["no message"])[-1][-300:] if done else "sinfo did not answer"
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


def _staging(ctx: Context, login: str | None) -> Check:
    found = setting(ctx, "slurm", "staging")
    if found is None:
        return setting_check(ctx, "slurm", "staging", "staging folder", PLACEHOLDER, "/shared/$USER/cloudtrain")
    # the folder, or the nearest parent that exists, writable (nothing is created)
    probe = 'd="$1"; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; test -d "$d" -a -w "$d" -a -x "$d"'
    done = _run(ctx, login, ["sh", "-c", probe, "sh", found[0]])
    where = f" on {login}" if login else ""
    if done is None or done.returncode != 0:
        return Check("slurm", "staging", "missing", f"{found[0]} ({found[1]}) is not writable{where}",
                     "choose a folder you can write on the cluster's shared filesystem")
    return Check("slurm", "staging", "ok", f"{found[0]} ({found[1]}, writable{where}; the nodes must see it at "
                                           "this path)")


def _run(ctx: Context, login: str | None, argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    env = {**os.environ, **ctx.env}
    if login:
        argv = [*shlex.split(env.get(SSH_ENV) or "ssh"), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", login,
                "--", shlex.join(argv)]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
