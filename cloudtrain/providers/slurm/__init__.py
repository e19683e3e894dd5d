"""Slurm: a job is one batch script (``sbatch``) whose single ``srun`` step runs the bootstrap once per node, from a
bundle staged in a folder on the cluster's shared filesystem. The commands run here, on a login node of the cluster
(``sbatch`` on PATH), or over SSH on one (``providers.slurm.login``).

This folder is the whole provider; ``PROVIDER`` says where each part is (see cloudtrain/registry.py)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="slurm", summary="Slurm clusters (sbatch and srun, from a login node)", package=__name__,
    provider="provider:SlurmProvider", title="Slurm", options="options:SlurmOptions",
    env={"staging": ("CLOUDTRAIN_SLURM_STAGING",), "login": ("CLOUDTRAIN_SLURM_LOGIN",),
         "partition": ("CLOUDTRAIN_SLURM_PARTITION", "SBATCH_PARTITION"),
         "account": ("CLOUDTRAIN_SLURM_ACCOUNT", "SBATCH_ACCOUNT"), "qos": ("CLOUDTRAIN_SLURM_QOS", "SBATCH_QOS")},
    placeholders={"staging": "/set-providers-slurm-staging"},
    plan_summary="provider:plan_summary", doctor="doctor:checks", node="node", platform="slurm",
    name_pattern=r"[^\s,]{1,128}", name_rule="--job-name: no spaces or commas, at most 128",
)
