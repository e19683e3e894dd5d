"""The plan-to-node contract, in one table: every ``CLOUDTRAIN_*`` variable (what it means, who sets it, who reads
it), the exit codes, and the defaults both sides must agree on. Code names a variable through this module (never a
string literal: tests/test_contract.py finds any), and docs/node-contract.md is generated from it:

    python -m cloudtrain.contract > docs/node-contract.md      # a test fails when the file is out of date

Standard library only, Python 3.8: nodes import it (the node entry, the runtime, checkpoints, node watch) from the
bundle's lib/. The bootstrap's first stage, which runs before the bundle is unpacked, names no variable.
"""

from __future__ import annotations

from typing import NamedTuple


class Variable(NamedTuple):
    name: str  # a trailing "_" is a prefix: CLOUDTRAIN_INPUT_<NAME>
    meaning: str
    set_by: str
    read_by: str
    side: str = "node"  # "node": between a plan and its nodes; "host": the user's machine


VARIABLES = (
    Variable("CLOUDTRAIN_STRATEGY", "ddp or fsdp, as the spec says", "plan (nodes.job_env)",
             "cloudtrain.runtime (wrap)"),
    Variable("CLOUDTRAIN_CHECKPOINT_URI", "where checkpoints are kept (checkpoint.uri)", "plan",
             "bootstrap (restore, plain-script sync), cloudtrain.runtime Checkpointer"),
    Variable("CLOUDTRAIN_LINEAGE", "which job a checkpoint belongs to (name, entry point, project folder, hashed)",
             "plan (a value in the spec's env wins)", "checkpoints (restore refuses another lineage's), Checkpointer"),
    Variable("CLOUDTRAIN_CHECKPOINT_TAKE_OVER", "1: node 0 takes the checkpoint URI's writer lease even where a live "
             "job of another lineage holds it (that job then publishes no more there)",
             "plan (checkpoint.take_over, --take-over)", "node steps (cloudtrain.checkpoint.writer)"),
    Variable("CLOUDTRAIN_CHECKPOINT_KEEP", "complete checkpoints to retain (>= 2)", "plan",
             "checkpoints (sync), Checkpointer"),
    Variable("CLOUDTRAIN_CHECKPOINT_INTERVAL", "seconds between saves / plain-script syncs", "plan",
             "bootstrap (sync every), Checkpointer"),
    Variable("CLOUDTRAIN_CHECKPOINT_DIR", "the folder a script writes checkpoints to (absolute on the node; "
             "checkpoint.dir, relative to the script's working folder, else one of the node's own)", "bootstrap, "
             "from the plan's checkpoint.dir (a value in the spec's env is kept)",
             "your script (also as ${CLOUDTRAIN_CHECKPOINT_DIR} in args), Checkpointer, bootstrap (restore, sync), "
             "node watch (idle)"),
    Variable("CLOUDTRAIN_CHECKPOINT_LAYOUT", "script: the checkpoint folder is the script's own (checkpoint.dir), "
             "published and restored entry by entry under the script's names, step-<N> folders included; unset: "
             "cloudtrain's step-<N> folders are published one by one (restored as step-<9 digits> with a manifest)",
             "plan (checkpoint.dir)", "bootstrap (sync, restore: cloudtrain.checkpoint.snapshots)"),
    Variable("CLOUDTRAIN_CHECKPOINT_FILES", "the files every save writes, one glob per line, relative to the "
             "checkpoint folder (checkpoint.files): a snapshot is published the moment each is whole and new",
             "plan (checkpoint.files)", "bootstrap (sync: cloudtrain.checkpoint.save_sets)"),
    Variable("CLOUDTRAIN_CHECKPOINT_QUIET", "seconds a file of a checkpoint folder whose format cannot say it is "
             "whole (a .json, a .npz) must stay unchanged before its snapshot is published (default 2); never what "
             "decides which files make up a save", "you (the spec's env)",
             "bootstrap (sync: cloudtrain.checkpoint.snapshots)"),
    Variable("CLOUDTRAIN_RESTORED_STEP", "the step this node restored into CLOUDTRAIN_CHECKPOINT_DIR before its "
             "workers started, or none: their Checkpointer's first restore loads it without listing the store again",
             "node steps (the bootstrap's restore)", "Checkpointer"),
    Variable("CLOUDTRAIN_OUTPUT_URI", "where the job's outputs go", "plan (bootstrap on a platform that uploads "
             "a folder itself: Azure ML)", "bootstrap (logs, outputs), Checkpointer (final save), status"),
    Variable("CLOUDTRAIN_OUTPUT_DIR", "the local folder copied to the output location when the node ends",
             "bootstrap", "your script, bootstrap"),
    Variable("CLOUDTRAIN_MAX_IDLE", "seconds without output, checkpoint or worker CPU use before the watchdog stops "
             "the job (default 1800; absent with max_idle: off)",
             "plan (max_idle)", "node watch"),
    Variable("CLOUDTRAIN_INPUT_", "CLOUDTRAIN_INPUT_<NAME>: where input <name> is (a URI, or a path the platform "
             "mounts)", "plan (the provider)", "your script"),
    Variable("CLOUDTRAIN_NNODES", "nodes in the job", "local provider (cloudtrain's contract), Azure ML's plan; "
             "bootstrap for the workers", "node contracts (local, Azure ML), your script"),
    Variable("CLOUDTRAIN_NODE_RANK", "this node's rank", "local provider (cloudtrain's contract); bootstrap for the "
             "workers", "local node contract, node watch, your script"),
    Variable("CLOUDTRAIN_PLATFORM", "the node contract the node runs under (sagemaker, azureml, vertex, local ...)",
             "bootstrap", "your script"),
    Variable("CLOUDTRAIN_JOB_ID", "the job's id", "bootstrap", "Checkpointer, your script"),
    Variable("CLOUDTRAIN_MASTER_ADDR", "node 0's address (cloudtrain's contract)", "local provider",
             "local node contract"),
    Variable("CLOUDTRAIN_MASTER_PORT", "the rendezvous port (cloudtrain's contract)", "local provider (at submit)",
             "local node contract"),
    Variable("CLOUDTRAIN_RDZV", "c10d or static rendezvous (cloudtrain's contract)", "local provider",
             "local node contract"),
    Variable("CLOUDTRAIN_LOCAL_ADDR", "the address this node's agent names itself by (cloudtrain's contract)",
             "nobody by default (node 0 is 127.0.0.1, the others localhost)", "local node contract"),
    Variable("CLOUDTRAIN_MASTER_OVERRIDE", "host:port torchrun really connects to, where the platform's own names "
             "do not resolve (a cloud contract emulated locally)", "local provider (--emulate)", "bootstrap"),
    Variable("CLOUDTRAIN_SUPERVISOR_FD", "a pipe the local supervisor holds open: the node stops when it closes",
             "local supervisor", "node watch"),
    Variable("CLOUDTRAIN_GRACE_PERIOD", "seconds between a node's own SIGTERM and SIGKILL", "local supervisor",
             "node watch"),
    Variable("CLOUDTRAIN_PROCESS_TAG", "marks every process of a local node, so none outlives it",
             "local supervisor", "cloudtrain.home.procs"),
    Variable("CLOUDTRAIN_RANK_REPORTS", "the folder each worker reports its process group to", "node watch",
             "cloudtrain.node.rank_report (in the workers)"),
    Variable("CLOUDTRAIN_REQUIRE_PROCESS_GROUP", "1: a node whose processes each trained alone (none took part in "
             "the job's process group) fails instead of succeeding", "plan (require_process_group)", "node watch"),
    Variable("CLOUDTRAIN_STOP_REASON_FILE", "a file where whoever stops the nodes says why when it is not a "
             "preemption (a peer failed, a cancel, max_runtime): such a node ends 'stopped: <why>'",
             "local supervisor", "node watch"),
    Variable("CLOUDTRAIN_SECRET_ARG_", "CLOUDTRAIN_SECRET_ARG_<n>: a secret script argument or pip requirement, "
             "kept off command lines",
             "plan (secrets.split_args)", "the bundle's sitecustomize (workers' sys.argv), bootstrap (requirements)"),
    Variable("CLOUDTRAIN_SECRET_", "CLOUDTRAIN_SECRET_<FIELD>: a secret in another spec field of a recovery chain, "
             "taken from the watcher's environment for a later leg", "you (where the submit note says so)",
             "cloudtrain.jobs.chain_file"),
    Variable("CLOUDTRAIN_STEP_REPORT_SECONDS", "at most one step event per this many seconds (default 2)", "you",
             "cloudtrain.runtime.report_step (cloudtrain.node.events)"),
    Variable("CLOUDTRAIN_TRANSFER_THREADS", "objects transferred (or deleted) at once by a restore, a checkpoint "
             "upload or retention (default 8)", "you (the spec's env, or your shell)", "cloudtrain.storage.transfer"),
    Variable("CLOUDTRAIN_FORCE_CPU", "1: use the CPU even where CUDA is available", "you",
             "cloudtrain.runtime (init_distributed)"),
    # spot notices (cloudtrain/node/spot_notice.py): checkpoint before the reclaim
    Variable("CLOUDTRAIN_SPOT_NOTICE", "on / off: poll the platform's spot notice (the node contract's SPOT_NOTICE: "
             "EC2 instance-action, Azure Scheduled Events, GCE instance/preempted); default: the contract's "
             "SPOT_NOTICE_ON (off on SageMaker, whose training containers have no documented IMDS access)",
             "you (the spec's env)", "bootstrap (spot notice)"),
    Variable("CLOUDTRAIN_METADATA_URL", "the metadata endpoint's scheme and host (default: the platform's, "
             "http://169.254.169.254 or http://metadata.google.internal); off: no polling",
             "you (tests: a fake on 127.0.0.1); local provider (--emulate: off unless set)", "bootstrap (spot notice)"),
    Variable("CLOUDTRAIN_CHECKPOINT_REQUEST", "a file the node writes (JSON: platform, seen, action, at) when the "
             "platform announces a reclaim: checkpoint at your next step (each new write is a new request; its "
             "mtime tells them apart)", "bootstrap (spot notice)", "Checkpointer, your script"),
    Variable("CLOUDTRAIN_CHECKPOINT_SIGNAL", "SIGUSR1: on a spot notice the node also sends that signal to the "
             "workers (only for a script that handles it: SIGUSR1's default action kills the process)",
             "you (the spec's env)", "bootstrap (spot notice)"),
    Variable("CLOUDTRAIN_HOME", "cloudtrain's own state on this machine (default ~/.cloudtrain)", "you",
             "cloudtrain (jobs, local store, temp files)", "host"),
    Variable("CLOUDTRAIN_CONFIG", "the settings file (profiles)", "you", "cloudtrain.spec.settings", "host"),
    Variable("CLOUDTRAIN_PROFILE", "the profile to use (default: default)", "you", "cloudtrain.spec.settings", "host"),
    Variable("CLOUDTRAIN_PLUGINS", "the provider plugins used: unset, every installed one; 'none'; or their names "
             "('toy,other'). cloudtrain's own tests set 'none'", "you", "cloudtrain.registry", "host"),
)
NAMES = {v.name for v in VARIABLES}

STRATEGY, CHECKPOINT_URI, LINEAGE, CHECKPOINT_KEEP, CHECKPOINT_INTERVAL, CHECKPOINT_DIR = (
    "CLOUDTRAIN_STRATEGY", "CLOUDTRAIN_CHECKPOINT_URI", "CLOUDTRAIN_LINEAGE", "CLOUDTRAIN_CHECKPOINT_KEEP",
    "CLOUDTRAIN_CHECKPOINT_INTERVAL", "CLOUDTRAIN_CHECKPOINT_DIR")
RESTORED_STEP, CHECKPOINT_QUIET = "CLOUDTRAIN_RESTORED_STEP", "CLOUDTRAIN_CHECKPOINT_QUIET"
TAKE_OVER = "CLOUDTRAIN_CHECKPOINT_TAKE_OVER"
CHECKPOINT_LAYOUT, SCRIPT_LAYOUT = "CLOUDTRAIN_CHECKPOINT_LAYOUT", "script"
CHECKPOINT_FILES = "CLOUDTRAIN_CHECKPOINT_FILES"
OUTPUT_URI, OUTPUT_DIR, MAX_IDLE, INPUT_PREFIX, NNODES, NODE_RANK, JOB_ID = (
    "CLOUDTRAIN_OUTPUT_URI", "CLOUDTRAIN_OUTPUT_DIR", "CLOUDTRAIN_MAX_IDLE", "CLOUDTRAIN_INPUT_", "CLOUDTRAIN_NNODES",
    "CLOUDTRAIN_NODE_RANK", "CLOUDTRAIN_JOB_ID")
TRANSFER_THREADS = "CLOUDTRAIN_TRANSFER_THREADS"
SUPERVISOR_FD, GRACE_PERIOD, PROCESS_TAG, RANK_REPORTS, SECRET_ARG_PREFIX, FORCE_CPU = (
    "CLOUDTRAIN_SUPERVISOR_FD", "CLOUDTRAIN_GRACE_PERIOD", "CLOUDTRAIN_PROCESS_TAG", "CLOUDTRAIN_RANK_REPORTS",
    "CLOUDTRAIN_SECRET_ARG_", "CLOUDTRAIN_FORCE_CPU")
HOME, CONFIG, PROFILE, PLUGINS = "CLOUDTRAIN_HOME", "CLOUDTRAIN_CONFIG", "CLOUDTRAIN_PROFILE", "CLOUDTRAIN_PLUGINS"
REQUIRE_PROCESS_GROUP, STOP_REASON_FILE = "CLOUDTRAIN_REQUIRE_PROCESS_GROUP", "CLOUDTRAIN_STOP_REASON_FILE"
PLATFORM, MASTER_OVERRIDE = "CLOUDTRAIN_PLATFORM", "CLOUDTRAIN_MASTER_OVERRIDE"
MASTER_ADDR, MASTER_PORT, RDZV, LOCAL_ADDR = (  # the local node contract's (cloudtrain/providers/local/node.py)
    "CLOUDTRAIN_MASTER_ADDR", "CLOUDTRAIN_MASTER_PORT", "CLOUDTRAIN_RDZV", "CLOUDTRAIN_LOCAL_ADDR")
SPOT_NOTICE, METADATA_URL = "CLOUDTRAIN_SPOT_NOTICE", "CLOUDTRAIN_METADATA_URL"
SECRET_FIELD_PREFIX, STEP_REPORT_SECONDS = "CLOUDTRAIN_SECRET_", "CLOUDTRAIN_STEP_REPORT_SECONDS"
CHECKPOINT_REQUEST, CHECKPOINT_SIGNAL = "CLOUDTRAIN_CHECKPOINT_REQUEST", "CLOUDTRAIN_CHECKPOINT_SIGNAL"

# cloudtrain's node variables a script's args (and resume_args) may name as ${NAME}: the node replaces each with its
# value before torchrun starts (no shell involved; $${NAME} stands for the text ${NAME}), and a plan refuses any
# other ${NAME} (INPUT_PREFIX: one for each input the spec declares).
ARG_VARIABLE = r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}"
ARG_VARIABLES = (CHECKPOINT_DIR, OUTPUT_DIR, CHECKPOINT_URI, OUTPUT_URI, NODE_RANK, NNODES, JOB_ID, PLATFORM, STRATEGY)

# Exit codes: the CLI's, and a node's.
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad input (the CLI), a node that cannot start (the bootstrap)
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_PREEMPTED = 143  # 128 + SIGTERM: what a container stopped by SIGTERM reports; a node that was asked to stop

# Defaults both sides use.
MIN_KEEP = 2  # complete checkpoints kept, at least (the spec refuses fewer)
SYNC_EVERY = 60.0  # seconds between a plain script's checkpoint syncs when the spec sets no interval
RUNTIME_MIN_TORCH = "2.4"  # the oldest torch cloudtrain.runtime's Checkpointer runs on (`nox -s compat` tests it)


def keep_count(value: str | None) -> int:
    """CLOUDTRAIN_CHECKPOINT_KEEP as a count: the spec's number, never below MIN_KEEP."""
    try:
        return max(MIN_KEEP, int(value)) if value else MIN_KEEP
    except ValueError:
        return MIN_KEEP


def env_int(env: dict[str, str], name: str, default: int) -> int:
    """A platform's integer variable (NODE_RANK, MASTER_PORT ...), ``default`` where unset or empty; a value that is
    not an integer is a ValueError naming it (the bootstrap reports it as the node's failure)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def markdown() -> str:
    rows = ["| variable | meaning | set by | read by |", "| --- | --- | --- | --- |"]
    for side, title in (("node", "Between a plan and its nodes"), ("host", "On your machine")):
        rows = rows if side == "node" else [*rows, "", f"## {title}", "", *rows[:2]]
        rows += [f"| `{v.name}{'<...>' if v.name.endswith('_') else ''}` | {v.meaning} | {v.set_by} | {v.read_by} |"
                 for v in VARIABLES if v.side == side]
    codes = [("EXIT_FAILED", EXIT_FAILED, "failed"), ("EXIT_USAGE", EXIT_USAGE, "bad input / a node that cannot "
             "start"), ("EXIT_INTERRUPTED", EXIT_INTERRUPTED, "Ctrl-C"), ("EXIT_PREEMPTED", EXIT_PREEMPTED,
             "asked to stop (SIGTERM): preempted, resumes from its checkpoints")]
    return "\n".join([
        "# The node contract", "",
        "Generated from `cloudtrain/contract.py` by `python -m cloudtrain.contract > docs/node-contract.md`; do not "
        "edit by hand. How a node learns its place in the cluster is each platform's own contract (its provider's "
        "`node.py`: see docs/writing-a-provider.md); these are cloudtrain's own variables.", "",
        "## Between a plan and its nodes", "", *rows, "", "## Exit codes", "", "| name | code | meaning |",
        "| --- | --- | --- |", *[f"| `{n}` | {c} | {m} |" for n, c, m in codes], "", "## Defaults", "",
        f"- `CLOUDTRAIN_CHECKPOINT_KEEP`: at least {MIN_KEEP}.",
        f"- A plain script's checkpoints are synced every {SYNC_EVERY:g} s when `CLOUDTRAIN_CHECKPOINT_INTERVAL` is "
        "not set.", ""])


if __name__ == "__main__":
    print(markdown(), end="")
