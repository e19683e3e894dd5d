"""Slurm's own commands: sbatch, squeue, scontrol, sacct (or ``sacct -c``, the job completion records, where the
cluster keeps no accounting) and scancel, run here or, with ``providers.slurm.login``, on the login host over SSH
(the user's OpenSSH configuration: keys, ports, jump hosts). Their output is parsed here and nowhere else."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from cloudtrain.errors import CloudtrainError, UserError

TIMEOUT = 60.0  # seconds for one command (slurmctld answers in milliseconds; a busy one in seconds)
ACCOUNTING_FIELDS = ("JobID", "JobName", "State", "ExitCode", "WorkDir", "Submit", "Start", "End", "NodeList")
SSH_ENV = "CLOUDTRAIN_SLURM_SSH"  # the ssh command to use (default: ssh), e.g. "ssh -F ~/.ssh/cluster.conf"
_PAIR = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


class SlurmError(CloudtrainError):
    """A Slurm command failed."""


class Commands:
    """Slurm's commands (and the shell, for the job folder) on this machine, or on ``login`` over SSH."""

    def __init__(self, login: str | None = None) -> None:
        self.login = login

    def argv(self, argv: Sequence[str]) -> list[str]:
        if not self.login:
            return list(argv)
        ssh = shlex.split(os.environ.get(SSH_ENV) or "ssh")
        return [*ssh, "-o", "BatchMode=yes", self.login, "--", shlex.join(argv)]

    def run(self, argv: Sequence[str], check: bool = True, data: bytes | None = None,
            binary: bool = False) -> subprocess.CompletedProcess[Any]:
        full = self.argv(argv)
        if shutil.which(full[0]) is None:
            raise _missing(full[0], self.login)
        try:
            done = subprocess.run(full, capture_output=True, timeout=TIMEOUT, input=data if binary else (
                data.decode() if data is not None else None), text=not binary)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer within {TIMEOUT:.0f}s" + self._where(),
                             remedy="check the cluster (`sinfo`, `scontrol ping`) and try again") from None
        if self.login and done.returncode == 255:  # ssh's own failure: the login host, not Slurm
            err = done.stderr.decode(errors="replace") if binary else done.stderr
            raise SlurmError(f"ssh {self.login} failed: {err.strip()[-300:]}", field="providers.slurm.login",
                             remedy=f"check that `ssh {self.login} sbatch --version` works without a password "
                                    "(keys or an agent; BatchMode)")
        if check and done.returncode != 0:
            err = done.stderr.decode(errors="replace") if binary else done.stderr
            raise SlurmError(f"{' '.join(argv[:2])} failed (exit {done.returncode}){self._where()}: "
                             f"{err.strip()[-500:]}",
                             remedy="see Slurm's message above; `cloudtrain doctor -p slurm` checks the setup")
        return done

    def _where(self) -> str:
        return f" on {self.login}" if self.login else ""

    # -- Slurm ---------------------------------------------------------------------------------------------
    def sbatch(self, script: str) -> str:
        """Submit a batch script (a path on the cluster); the new job's id."""
        out = self.run(["sbatch", "--parsable", script]).stdout.strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out!r}, not a job id")
        return job_id

    def ids_named(self, name: str) -> list[str]:
        """The ids of the jobs slurmctld still holds under this name (running, pending, or recently ended)."""
        out = self.run(["squeue", "--states=all", "--noheader", f"--name={name}", "--format=%i"]).stdout
        return sorted({line.strip() for line in out.splitlines() if line.strip().isdigit()}, key=int)

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job``, one field per key; None once slurmctld no longer holds the job."""
        done = self.run(["scontrol", "--oneliner", "show", "job", job_id], check=False)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return None
            raise SlurmError(f"scontrol show job {job_id} failed: {done.stderr.strip()[-500:]}")
        line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
        return dict(_PAIR.findall(line)) or None

    def queued(self) -> list[dict[str, str]]:
        """This user's jobs slurmctld holds: id, name, state, comment and submit time."""
        out = self.run(["squeue", "--me", "--states=all", "--noheader", "--format=%i|%j|%T|%k|%V"]).stdout
        keys = ("JobID", "JobName", "State", "Comment", "Submit")
        return [dict(zip(keys, line.split("|", 4), strict=True)) for line in out.splitlines()
                if line.count("|") >= 4]

    def accounting(self, name: str | None = None, since: str = "2000-01-01") -> list[dict[str, str]]:
        """This user's ended jobs (named ``name``) as Slurm recorded them: sacct, or ``sacct -c`` (the job
        completion records) where the cluster keeps no accounting (it reads the whole file: filter by name
        yourself). Oldest first; a requeued job has a record per run. [] when neither is kept."""
        fields = ["--parsable2", "--noheader", f"--format={','.join(ACCOUNTING_FIELDS)}", f"--starttime={since}",
                  *([f"--name={name}"] if name else [])]
        try:
            done = self.run(["sacct", "--allocations", *fields], check=False)
        except UserError:  # no sacct here: nothing recorded to read
            return []
        if done.returncode != 0 and "accounting storage is disabled" in done.stderr.lower():
            done = self.run(["sacct", "--completion", *fields], check=False)
        if done.returncode != 0:
            return []
        rows = [line.split("|") for line in done.stdout.splitlines()]
        return [dict(zip(ACCOUNTING_FIELDS, row, strict=True)) for row in rows
                if len(row) == len(ACCOUNTING_FIELDS) and row[0].isdigit()]

    def scancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])


def _missing(program: str, login: str | None) -> UserError:
    if login:
        return UserError(f"{program} is not on PATH: cloudtrain reaches the login host {login} with OpenSSH",
                         field="providers.slurm.login", remedy="install the OpenSSH client")
    return UserError(f"{program} is not on PATH: cloudtrain submits to Slurm from a machine of the cluster",
                     field="--provider",
                     remedy="run cloudtrain on a login node of the cluster (where sbatch works), set "
                            "providers.slurm.login to reach one over SSH, or add Slurm's programs to PATH")
