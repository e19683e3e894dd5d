"""``providers.slurm`` in a job spec (and in a profile): where the job runs on the cluster, what it asks Slurm for,
and the Python environment its nodes start the bootstrap with."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from cloudtrain.spec.fields import Duration, Model, one_token, path_problem

MAX_SIGNAL_LEAD = 65535  # seconds: sbatch's --signal takes no more


class SlurmOptions(Model):
    staging: str | None = Field(
        None, description="An absolute folder on the cluster's shared filesystem, seen at the same path by this "
                          "machine and every node: bundles, batch scripts, logs and (by default) checkpoints and "
                          "outputs go there (required to submit)")
    login: str | None = Field(
        None, description="Submit over SSH to this login host ('user@host', or a Host of your OpenSSH config); "
                          "default: this machine runs sbatch")
    partition: str | None = Field(None, description="sbatch --partition (default: the cluster's default partition)")
    account: str | None = Field(None, description="sbatch --account")
    qos: str | None = Field(None, description="sbatch --qos (a preemptible QOS is Slurm's spot capacity)")
    constraint: str | None = Field(None, description="sbatch --constraint, e.g. 'a100&ib'")
    gpu_type: str | None = Field(
        None, description="The GRES type your cluster gives the accelerator (default: its model in lowercase, "
                          "'A100:8' -> a100:8; '' asks for untyped GPUs)")
    gpu_flag: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node", description="How GPUs are asked for: --gpus-per-node=a100:8 or --gres=gpu:a100:8")
    cpus_per_node: int | None = Field(None, ge=1, le=4096, description="CPUs per node (--cpus-per-task)")
    memory: str | None = Field(None, pattern=r"^\d+[KMGT]?$", description="Memory per node (--mem), e.g. '64G'")
    python: str = Field("python3", description="The Python on the nodes that runs the bootstrap (with torch)")
    venv: str | None = Field(None, description="A virtualenv or conda environment folder on the nodes, activated "
                                               "before the bootstrap starts")
    setup: list[str] = Field(default_factory=list,
                             description="Shell lines run on the batch node before the nodes start, e.g. "
                                         "'module load cuda/12.1'")
    sbatch: list[str] = Field(default_factory=list,
                              description="More sbatch options, one per #SBATCH line, e.g. '--exclusive'")
    grace_period: Duration = Field(
        60, le=MAX_SIGNAL_LEAD, description="Seconds before the time limit (max_runtime) at which the nodes get "
                                            "SIGTERM and take a final checkpoint (--signal=TERM@N)")

    _tokens = field_validator("staging", "login", "partition", "account", "qos", "constraint", "gpu_type", "python",
                              "venv")(lambda value: one_token(value) if value != "" else value)

    @field_validator("staging", "venv")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path on the cluster's shared filesystem")
        if value and (problem := path_problem(value)):
            raise ValueError(f"{problem}: name a folder the cluster's file system can hold")
        if value and ".." in value.split("/"):  # the file:// locations derived from staging refuse it too
            raise ValueError(f"{value!r} contains '..': write the folder's own absolute path")
        return value.rstrip("/") or "/" if value else value

    @field_validator("setup", "sbatch")
    @classmethod
    def _lines(cls, value: list[str]) -> list[str]:
        for line in value:
            if "\n" in line or "\r" in line or not line.strip():
                raise ValueError(f"{line!r}: one non-empty line per entry")
        return value

    @field_validator("sbatch")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for line in value:
            if not line.strip().startswith("-"):
                raise ValueError(f"{line!r} is not an sbatch option (write e.g. '--exclusive', without #SBATCH)")
        return value
