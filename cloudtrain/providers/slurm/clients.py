"""Slurm's own commands, run here: sbatch, squeue, scontrol, sacct (or ``sacct -c``, the job completion records,
where the cluster keeps no accounting) and scancel. Their output is parsed here and nowhere else."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from cloudtrain.errors import CloudtrainError, UserError

TIMEOUT = 60.0  # seconds for one command (slurmctld answers in milliseconds; a busy one in seconds)
ACCOUNTING_FIELDS = ("JobID", "JobName", "State", "ExitCode", "WorkDir", "Submit", "Start", "End", "NodeList")
_PAIR = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


class SlurmError(CloudtrainError):
    """A Slurm command failed."""


def _missing(program: str) -> UserError:
    return UserError(f"{program} is not on PATH: cloudtrain submits to Slurm from a machine of the cluster",
                     field="--provider",
                     remedy="run cloudtrain on a login node of the cluster (where sbatch works), or add Slurm's "
                            "client programs to PATH")


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise _missing(argv[0])
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {TIMEOUT:.0f}s",
                         remedy="check the cluster (`sinfo`, `scontrol ping`) and try again") from None
    if check and done.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:2])} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}",
                         remedy="see Slurm's message above; `cloudtrain doctor -p slurm` checks the setup")
    return done


def sbatch(script: str) -> str:
    """Submit a batch script; the new job's id."""
    out = run(["sbatch", "--parsable", script]).stdout.strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {out!r}, not a job id")
    return job_id


def ids_named(name: str) -> list[str]:
    """The ids of the jobs slurmctld still holds under this name (running, pending, or recently ended)."""
    out = run(["squeue", "--states=all", "--noheader", f"--name={name}", "--format=%i"]).stdout
    return sorted({line.strip() for line in out.splitlines() if line.strip().isdigit()}, key=int)


def show_job(job_id: str) -> dict[str, str] | None:
    """``scontrol show job``, one field per key; None once slurmctld no longer holds the job."""
    done = run(["scontrol", "--oneliner", "show", "job", job_id], check=False)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return None
        raise SlurmError(f"scontrol show job {job_id} failed: {done.stderr.strip()[-500:]}")
    line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    return dict(_PAIR.findall(line)) or None


def queued(user_only: bool = True) -> list[dict[str, str]]:
    """The jobs slurmctld holds (this user's): id, name, state and comment."""
    argv = ["squeue", "--states=all", "--noheader", "--format=%i|%j|%T|%k|%V"]
    out = run([*argv, "--me"] if user_only else argv).stdout
    keys = ("JobID", "JobName", "State", "Comment", "Submit")
    return [dict(zip(keys, line.split("|", 4), strict=True)) for line in out.splitlines() if line.count("|") >= 4]


def accounting(name: str | None = None, since: str = "2000-01-01") -> list[dict[str, str]]:
    """This user's ended jobs (named ``name``) as Slurm recorded them: sacct, or ``sacct -c`` (the job completion
    records) where the cluster keeps no accounting (it reads the whole file: filter by name yourself). Oldest first;
    a requeued job has a record per run. [] when neither is kept."""
    if shutil.which("sacct") is None:
        return []
    fields = ["--parsable2", "--noheader", f"--format={','.join(ACCOUNTING_FIELDS)}", f"--starttime={since}",
              *([f"--name={name}"] if name else [])]
    done = run(["sacct", "--allocations", *fields], check=False)
    if done.returncode != 0 and "accounting storage is disabled" in done.stderr.lower():
        done = run(["sacct", "--completion", *fields], check=False)
    if done.returncode != 0:
        return []
    rows = [line.split("|") for line in done.stdout.splitlines()]
    return [dict(zip(ACCOUNTING_FIELDS, row, strict=True)) for row in rows
            if len(row) == len(ACCOUNTING_FIELDS) and row[0].isdigit()]


def scancel(job_id: str) -> None:
    run(["scancel", job_id])


def partitions() -> list[str]:
    out = run(["sinfo", "--noheader", "--format=%R"]).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]
