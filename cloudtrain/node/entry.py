"""The node's run, once its first stage (entrypoints/bootstrap.py) has fetched, verified and unpacked the bundle and
put the bundle's lib/ on sys.path: mask secrets in all output from then on (its own and its children's), derive this
node's place in the cluster with the platform's node contract (cloudtrain/node/launch.py), install the job's
requirements, run ``torchrun`` with the derived arguments, forward signals to it, and report the outcome (succeeded,
failed or preempted) as an exit code, a last log line and, when asked, a JSON status file.

Standard library only, Python 3.8: it runs on any image cloudtrain can choose, before anything is installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cloudtrain import contract as names
from cloudtrain.checkpoint.files import working_files
from cloudtrain.errors import NodeStartError
from cloudtrain.node import launch, node_files


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def report_failure(contract: Any, env: dict[str, str], message: str) -> None:
    """Where the platform reads a failed job's reason (the contract's ``report_failure``: SageMaker's failure file);
    elsewhere the exit code and the log's last line say it. Best effort."""
    hook = getattr(contract, "report_failure", None)
    if hook is None:
        return
    try:
        hook(env, message)
    except OSError as exc:
        log(f"warning: could not report the failure to the platform: {exc}")


def mask_output(env: dict[str, str]) -> Any:
    """From here on, everything this node prints, and everything the processes it starts print, reaches the node's
    log with secrets masked (cloudtrain/node/log_masking.py)."""
    from cloudtrain.node.log_masking import MaskedOutput, Masker

    return MaskedOutput(Masker.from_env(env))


def platform_outputs(contract: Any, env: dict[str, str], start_dir: Path) -> Path | None:
    """The folder the platform uploads itself (the contract's ``outputs``: Azure ML's ./outputs), or None."""
    hook = getattr(contract, "outputs", None)
    return Path(hook(env, start_dir)) if hook else None


def node_watch(env: dict[str, str], workdir: Path, on_force: Any) -> Any:
    """The node watch (cloudtrain/node/watch.py: the supervisor, the max_idle watchdog, rank reports, why workers
    failed)."""
    from cloudtrain.node.watch import NodeWatch

    return NodeWatch(env, workdir, on_force)


def main(argv: list[str], unpacked: Path, early_stop: list[int], started: float) -> int:
    """Run this node from the bundle unpacked at ``unpacked``; ``argv``: bootstrap.py's whole command line (its
    interface: launch.parse_args). ``early_stop``: the signals that arrived since the node started (a SIGTERM while
    unpacking or restoring still means "preempted"); ``started``: when it started. Returns the node's exit code."""
    with contextlib.ExitStack() as output:  # the masked output, entered below, ends last
        return _run(argv, unpacked, early_stop, started, output)


def _run(argv: list[str], unpacked: Path, early_stop: list[int], started: float,
         output: contextlib.ExitStack) -> int:
    args, user_args = launch.parse_args(argv)
    env = dict(os.environ)
    for item in args.env:
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    status: dict[str, object] = {"outcome": "failed", "returncode": None, "started": started}
    contract: Any = None  # the platform's node contract, once loaded
    holder: Any = None  # node 0's lease of the checkpoint URI, once taken (cloudtrain/checkpoint/writer.py)
    try:
        from cloudtrain.node import process_tree

        workdir = unpacked.parent
        node_files.reserve(args.status_file)  # the status file's room, held: a disk the job fills cannot take it
        process_tree.become_subreaper()  # what the job leaves behind comes back to this process, to be ended
        masking = output.enter_context(mask_output(env))
        contract = launch.load_contract(unpacked / "lib" / args.node_contract)
        cluster = launch.detect_cluster(contract, env, args.nproc_per_node)
        status["cluster"] = asdict(cluster)
        log(f"node {cluster.node_rank}/{cluster.nnodes} on {cluster.platform}: {cluster.nproc_per_node} processes, "
            f"rendezvous {cluster.rdzv} at {cluster.master_addr}:{cluster.master_port}")
        from cloudtrain.node import events  # the job's timeline: this node is up (its log carries it to status)
        events.emit("node_started", rank=cluster.node_rank, nodes=cluster.nnodes, platform=cluster.platform)

        from cloudtrain.node.worker_echo import WorkerEcho

        echo = WorkerEcho(workdir / "worker-logs")  # runs of an earlier attempt in workdir are not echoed again

        def forced(reason: str) -> None:  # the node ends now (os._exit): say why, and let the last lines out
            node_files.write_status(args.status_file,
                                    {**status, "outcome": "failed", "reason": reason, "ended": time.time()})
            echo.finish()
            masking.close()

        watch = node_watch(env, workdir, forced)
        src, site = unpacked / "src", workdir / "site-packages"
        from cloudtrain.node import prepare

        failed = prepare.install_requirements(src, site, args.requirements_file, args.requirement, env)
        if failed:
            raise NodeStartError(failed)
        python_path = [str(unpacked / "lib"), str(src), str(site)]
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        uploaded = platform_outputs(contract, env, Path.cwd())  # a folder the platform uploads itself
        env.update({
            "PYTHONPATH": os.pathsep.join(python_path),
            "PYTHONUNBUFFERED": "1",
            names.NNODES: str(cluster.nnodes),
            names.NODE_RANK: str(cluster.node_rank),
            names.PLATFORM: cluster.platform,
            names.JOB_ID: args.job_id,
            # checkpoint.dir is relative to the script's working folder
            names.CHECKPOINT_DIR: str(src / (env.get(names.CHECKPOINT_DIR) or workdir / "checkpoints")),
            names.OUTPUT_DIR: env.get(names.OUTPUT_DIR) or str(uploaded or workdir / "outputs"),
        })
        outputs = Path(env[names.OUTPUT_DIR])
        outputs.mkdir(parents=True, exist_ok=True)
        if uploaded is not None:  # the platform uploads that folder (Azure ML: to the workspace's datastore)
            env.setdefault(names.OUTPUT_URI, outputs.resolve().as_uri())  # so node logs go there too
            if not (src / "outputs").exists():
                (src / "outputs").symlink_to(outputs.resolve())  # a script's own ./outputs is that folder
        env.update(launch.launcher_env(contract, cluster, env))
        from cloudtrain.node import steps

        earlier = steps.fresh_checkpoint_folder(env, workdir)
        holder = steps.hold_checkpoint_uri(env, cluster.node_rank, watch.stop)  # taken while the restore runs
        failed = steps.restore_checkpoint(env, src, earlier)
        failed = steps.uri_refused(holder) or failed  # another job writes to the URI: that first, whatever else
        if failed:
            raise NodeStartError(failed)
        if env.get(names.RESTORED_STEP, "none") != "none":
            user_args += args.resume_arg
        user_args = prepare.expand_args(user_args, env)
        argv_ = launch.torchrun_argv(launch.reachable(cluster, env), launch.target(args, user_args), args.job_id,
                                     python=sys.executable, workdir=str(workdir))
        started_files = working_files(src)
        if early_stop:
            code, stopped = names.EXIT_PREEMPTED, True
        else:
            log("torchrun: " + " ".join(argv_[1:]))
            from cloudtrain.node import spot_notice, torchrun

            syncer = steps.start_checkpoint_sync(env, src, cluster.node_rank,
                                                 world_size=cluster.nnodes * cluster.nproc_per_node)
            extra = watch.torchrun_started()
            asks, notices = spot_notice.start(contract, env, workdir)  # checkpoint before the reclaim
            echo.start()
            try:
                code, stopped = torchrun.run(argv_, src, {**env, **extra, **asks}, early_stop)
            finally:
                echo.finish()  # at once: what the workers wrote last, before anything the node says after
                if notices:
                    notices.stop()
            watch.torchrun_ended()
            leftovers = process_tree.end_leftovers_said(log)  # none outlives its node, on success too
            # a save cut short by a stop (or a crash) may be the first of a run, whose set of files is not known
            sync_error = steps.finish_checkpoint_sync(syncer, env, src, succeeded=code == 0 and not stopped)
            if sync_error:
                status["error"] = sync_error
            if code != 0 and not stopped and not watch.reason:  # workers that failed: was it what they loaded?
                aside = steps.judge_failure(env, src, workdir, code, masking.masker)
                if aside:
                    status["set_aside"] = aside
            # what the node leaves behind that no restart will have: torn checkpoints, files in the working folder
            warnings = [*steps.unpublished_checkpoints(syncer),
                        *steps.stray_files(started_files, env, src), *leftovers]  # at every end
            log_warning = steps.upload_logs(env, src, workdir, cluster.node_rank, masking.masker)
            warnings += [log_warning] if log_warning else []
            if warnings:
                status["warnings"] = warnings
            lost = steps.upload_outputs(env, src, cluster.node_rank)
            if lost and "error" not in status:  # the job's outputs are not where it said: it has not succeeded
                status["error"] = lost
    except (NodeStartError, OSError) as exc:  # an OSError only where the disk filled up (node_files says it)
        if not isinstance(exc, NodeStartError) and not node_files.disk_full(exc):
            raise
        why = exc.message if isinstance(exc, NodeStartError) else node_files.refused(exc, args.workdir)
        log(f"error: {why}")
        if contract is not None:
            report_failure(contract, env, f"cloudtrain: {why}")
        status.update(outcome="failed", error=why, returncode=names.EXIT_USAGE, ended=time.time())
        if holder is not None:
            holder.finish(release=True)
        node_files.write_status(args.status_file, status)
        return names.EXIT_USAGE
    from cloudtrain.node import outcome

    def record(done: dict[str, object]) -> str | None:
        steps.let_go_of_checkpoint_uri(holder, str(done.get("outcome")))  # before the status says the node ended
        return node_files.write_status(args.status_file, done)

    return outcome.conclude(status, code, stopped, watch, cluster, launch.visible_gpus(env), started,
                            lambda message: report_failure(contract, env, message), record)
