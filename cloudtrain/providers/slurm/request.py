"""The batch script a Slurm job is, and the sbatch command that submits it: the plan's request, shown in full.

One ``srun`` step with one task per node runs the bootstrap on every node. The nodes get SIGTERM ``grace_period``
seconds before the time limit (``--signal=TERM@N``: the step's tasks, the bootstraps, which take a final checkpoint
and stop) and when Slurm requeues or preempts the job (it signals every task itself). Not ``B:`` (the batch shell
only): the shell would have to pass the signal on, and the nodes would get it twice on a requeue. With
``max_restarts`` the job is requeued when preempted (``--requeue``) and the script starts it again until
SLURM_RESTART_COUNT passes max_restarts; each run resumes from the newest checkpoint. A node that fails stops the
others (``--kill-on-bad-exit``; ``node_command`` says how a node that was asked to stop is kept from doing so).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from cloudtrain import contract
from cloudtrain.providers.slurm.options import SlurmOptions
from cloudtrain.spec.model import JobSpec

WORKDIR = "node-${SLURM_NODEID}"  # each node's bootstrap folder, in the job's folder (expanded on the node)
STATUS_FILE = "${PWD}/node-${SLURM_NODEID}.status.json"  # what each node says at its end (warnings), for status
STOPPED_MARK = "node-${SLURM_NODEID}.stopped"  # a node that stopped when asked to (node_command), this run
COMMENT = "cloudtrain"  # --comment: how `list` tells cloudtrain's jobs from the others


@dataclass(frozen=True)
class Layout:
    """Where a job's files are on the shared filesystem."""

    job_dir: str  # <staging>/jobs/<job id>: the job's working directory (its WorkDir in Slurm)

    @property
    def script(self) -> str:
        return f"{self.job_dir}/job.sbatch"

    @property
    def env_file(self) -> str:
        return f"{self.job_dir}/job.env"  # the job's variables (secrets too): 0600, sourced by the script

    @property
    def record(self) -> str:
        return f"{self.job_dir}/job.json"  # what status reads back: output URI, max_restarts, the bundle digest

    @property
    def batch_log(self) -> str:
        return f"{self.job_dir}/batch.log"

    def node_log(self, rank: int | str) -> str:
        return f"{self.job_dir}/node-{rank}.log"

    @property
    def stop_reason(self) -> str:
        return f"{self.job_dir}/stop-reason"  # a failed node's "node N failed", read by the peers srun then stops


def time_limit(seconds: int) -> str:
    """sbatch --time as days-hours:minutes:seconds, rounded up to Slurm's granularity (a minute)."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def gpu_request(spec: JobSpec, gpu_type: str | None, flag: str) -> str | None:
    """``A100:8`` -> ``--gpus-per-node=a100:8`` (or ``--gres=gpu:a100:8``); None without an accelerator."""
    if not spec.accelerator:
        return None
    kind = (spec.accelerator_model or "").lower() if gpu_type is None else gpu_type
    count = str(spec.gpus_per_node)
    if flag == "gres":
        return f"--gres=gpu:{kind}:{count}" if kind else f"--gres=gpu:{count}"
    return f"--gpus-per-node={kind}:{count}" if kind else f"--gpus-per-node={count}"


def sbatch_options(spec: JobSpec, options: SlurmOptions, job_id: str, layout: Layout) -> list[str]:
    """Every #SBATCH option of the script, in order."""
    o = options.model_dump()
    lines = [f"--job-name={job_id}", f"--comment={COMMENT}", f"--nodes={spec.nodes}", "--ntasks-per-node=1",
             f"--chdir={layout.job_dir}", f"--output={layout.batch_log}", "--open-mode=append",
             f"--time={time_limit(spec.max_runtime)}", f"--signal=TERM@{min(o['grace_period'], spec.max_runtime)}",
             "--requeue" if spec.max_restarts else "--no-requeue"]
    for key in ("partition", "account", "qos", "constraint"):
        if o.get(key):
            lines.append(f"--{key}={o[key]}")
    gpus = gpu_request(spec, o.get("gpu_type"), o["gpu_flag"])
    lines += [gpus] if gpus else []
    lines += [f"--cpus-per-task={o['cpus_per_node']}"] if o.get("cpus_per_node") else []
    lines += [f"--mem={o['memory']}"] if o.get("memory") else []
    return [*lines, *(line.strip() for line in o["sbatch"])]


def node_command(argv: list[str]) -> str:
    """The bootstrap's command line for ``srun``, run by a shell on each node so its folder can name the node.

    srun stops every node once one exits non-zero (``--kill-on-bad-exit``): a node that failed before the
    rendezvous would otherwise leave the others waiting for it until torchrun's rendezvous timeout. A node that
    stopped when asked to (a preemption, a requeue, the time limit: EXIT_PREEMPTED after its final checkpoint) must
    not cut its peers' checkpoints short, so it exits 0 to srun and leaves a mark (STOPPED_MARK) that the batch
    script turns back into EXIT_PREEMPTED. The shell's no-op TERM trap lets it outlive the signal Slurm sends every
    process of the step, so it is there to read the bootstrap's exit code. A node that failed says so in the job's
    stop-reason file (``CLOUDTRAIN_STOP_REASON_FILE``) before srun sees its exit: the peers srun then stops end
    "stopped: node N failed", not "preempted", as they do under the local supervisor."""
    words = [f'"{a}"' if a in (WORKDIR, STATUS_FILE) else shlex.quote(a) for a in argv]
    reason = f'"${contract.STOP_REASON_FILE}"'
    return (f"trap : TERM; {' '.join(words)}; code=$?; "
            f'if [ "$code" -eq {contract.EXIT_PREEMPTED} ]; then : > "{STOPPED_MARK}"; exit 0; fi; '
            f'if [ "$code" -ne 0 ] && [ ! -s {reason} ]; then echo "node $SLURM_NODEID failed" > {reason}; fi; '
            'exit "$code"')


def batch_script(spec: JobSpec, options: SlurmOptions, job_id: str, layout: Layout, argv: list[str],
                 digest: str) -> str:
    setup = [*options.setup]
    if options.venv:
        venv = shlex.quote(options.venv)
        setup.append(f"if [ -f {venv}/bin/activate ]; then . {venv}/bin/activate; "
                     f"else conda activate {venv}; fi")
    srun = (f"srun --nodes={spec.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
            f"--output={shlex.quote(layout.node_log('%n'))} --open-mode=append")
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {line}" for line in sbatch_options(spec, options, job_id, layout)),
        f"# cloudtrain job {job_id}, bundle {digest}",
        "set -u",
        'restarts="${SLURM_RESTART_COUNT:-0}"',
        'echo "[cloudtrain] slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, run $((restarts + 1))"',
        f'if [ "$restarts" -gt {spec.max_restarts} ]; then',
        f'  echo "[cloudtrain] requeued $restarts times, more than max_restarts ({spec.max_restarts}): '
        'not started again" >&2',
        "  exit 1",
        "fi",
        "rm -f node-*.stopped node-*.status.json* stop-reason  # what an earlier run of a requeued job left",
        *setup,
        f"set -a; . {shlex.quote(layout.env_file)}; set +a",
        f"export {contract.STOP_REASON_FILE}={shlex.quote(layout.stop_reason)}",
        "# SIGTERM (a requeue, a preemption, scancel) reaches every node from Slurm itself: wait for them to stop",
        "trap 'echo \"[cloudtrain] SIGTERM: the nodes take a final checkpoint and stop\"' TERM",
        f"{srun} \\\n  /bin/sh -c {shlex.quote(node_command(argv))} &",
        "step=$!",
        'while :; do wait "$step"; code=$?; kill -0 "$step" 2>/dev/null || break; done',
        'echo "[cloudtrain] the nodes ended (srun exit $code)"',
        f'if [ "$code" -eq 0 ] && ls node-*.stopped >/dev/null 2>&1; then code={contract.EXIT_PREEMPTED}; fi',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def env_file(env: dict[str, str]) -> str:
    """The job's variables as the script sources them (with ``set -a``): one quoted assignment per line."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in sorted(env.items()))
