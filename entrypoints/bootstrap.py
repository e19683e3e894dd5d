#!/usr/bin/env python3
"""cloudtrain's in-node bootstrap: the first thing every node of every job runs, locally and in the cloud.

It must run on any image cloudtrain can choose (Python 3.8 and newer, with torch), so it uses the standard
library only, and nothing newer than Python 3.8 has (tests/test_bootstrap.py runs under 3.8 in CI). Steps:
unpack the source bundle safely, mask secrets in all output from then on (its own and its children's), derive this
node's place in the cluster with the platform's node contract (the provider's node.py, from the bundle's lib/),
install the job's requirements, run ``torchrun`` with the derived arguments, forward signals to it, and report the
outcome (succeeded, failed or preempted) as an exit code, a last log line and, when asked, a JSON status file.

It stays one file a node runs with ``python3 bootstrap.py`` before anything is installed; what it runs after the
bundle is unpacked comes from the bundle's lib/ (the node contract, and cloudtrain/node/: log masking, node watch,
worker echo, requirements and arguments, torchrun, node steps, the outcome), put on sys.path once. Its first half is
pure (no I/O but reading a contract's inputs): the planner loads this file and calls it, so a plan's torchrun lines
are the nodes'. The second half runs the node.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import tarfile
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# The node contract's codes and names this file uses: its own copy of cloudtrain/contract.py (it runs before the
# bundle that carries that module is unpacked); tests/test_contract.py keeps the two equal.
EXIT_USAGE = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM: what a container stopped by SIGTERM reports
NNODES, NODE_RANK, PLATFORM, JOB_ID = "CLOUDTRAIN_NNODES", "CLOUDTRAIN_NODE_RANK", "CLOUDTRAIN_PLATFORM", \
    "CLOUDTRAIN_JOB_ID"
CHECKPOINT_DIR, OUTPUT_DIR, OUTPUT_URI = "CLOUDTRAIN_CHECKPOINT_DIR", "CLOUDTRAIN_OUTPUT_DIR", "CLOUDTRAIN_OUTPUT_URI"
MASTER_OVERRIDE = "CLOUDTRAIN_MASTER_OVERRIDE"
RESTORED_STEP = "CLOUDTRAIN_RESTORED_STEP"
MAX_MEMBER_BYTES = 8 * 1024**3
MAX_TOTAL_BYTES = 32 * 1024**3
PLAIN_CONTRACT = "cloudtrain/providers/local/node.py"  # cloudtrain's own node contract, under the bundle's lib/


# == the pure half: what the planner imports (cloudtrain/plan/node_commands.py) ==================================


class BootstrapError(Exception):
    """A node cannot start: bad bundle, bad environment. Printed without a traceback."""


@dataclass(frozen=True)
class ClusterInfo:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc_per_node: int
    rdzv: str  # "c10d" (ranks by arrival) or "static" (the provider fixes node ranks)
    platform: str
    local_addr: str | None = None


def visible_gpus(env: dict[str, str]) -> int:
    """GPUs this node may use, without importing torch: CUDA_VISIBLE_DEVICES, else the driver's device list."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    proc = Path("/proc/driver/nvidia/gpus")
    return len(list(proc.iterdir())) if proc.is_dir() else 0


def resolve_nproc(requested: str, env: dict[str, str]) -> int:
    if requested == "auto":
        return visible_gpus(env) or 1
    try:
        value = int(requested)
    except ValueError:
        raise BootstrapError(f"--nproc-per-node must be 'auto' or an integer, got {requested!r}") from None
    if value < 1:
        raise BootstrapError("--nproc-per-node must be >= 1")
    return value


def load_contract(path: Path) -> Any:
    """A node contract module (a provider's node.py, shipped in the bundle's lib/), loaded from its file: standard
    library only, and no package of it is imported (its folder's __init__ may need more than Python 3.8 has)."""
    if not path.is_file():
        raise BootstrapError(f"node contract {path} is not in the bundle")
    spec = importlib.util.spec_from_file_location(f"cloudtrain_node_{path.parent.name}", path)
    if spec is None or spec.loader is None:
        raise BootstrapError(f"node contract {path} cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def detect_cluster(contract: Any, env: dict[str, str], nproc_request: str = "auto") -> ClusterInfo:
    """This node's place in the cluster, as its platform's contract reads it from ``env``."""
    nproc = resolve_nproc(nproc_request, env)
    try:
        found = contract.detect(env)
        cluster = ClusterInfo(nnodes=int(found["nnodes"]), node_rank=int(found["node_rank"]),
                              master_addr=str(found["master_addr"]), master_port=int(found["master_port"]),
                              nproc_per_node=nproc, rdzv=str(found.get("rdzv", "static")), platform=contract.PLATFORM,
                              local_addr=found.get("local_addr"))
    except (ValueError, KeyError, TypeError) as exc:
        raise BootstrapError(str(exc)) from None
    if not 0 <= cluster.node_rank < cluster.nnodes:
        raise BootstrapError(f"node rank {cluster.node_rank} is outside 0..{cluster.nnodes - 1}")
    return cluster


def launcher_env(contract: Any, cluster: ClusterInfo, env: dict[str, str]) -> dict[str, str]:
    """The variables the platform's own launcher gives the processes it starts (the contract's ``launcher_env``), so
    scripts written for that platform run unchanged here; a variable the job already sets (the spec's env) wins."""
    hook = getattr(contract, "launcher_env", None)
    found = hook(asdict(cluster), env, visible_gpus(env)) if hook else {}
    return {key: value for key, value in found.items() if key not in env}


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


def reachable(cluster: ClusterInfo, env: dict[str, str]) -> ClusterInfo:
    """Where torchrun really connects. Only local emulation sets CLOUDTRAIN_MASTER_OVERRIDE (algo-1:7777 does not
    resolve on a laptop, and fixed ports collide between jobs); on a cloud node it is the derived address."""
    override = env.get(MASTER_OVERRIDE)
    if not override:
        return cluster
    host, _, port = override.rpartition(":")
    return replace(cluster, master_addr=host, master_port=int(port), local_addr=host)


def torchrun_argv(cluster: ClusterInfo, target: list[str], job_id: str, python: str = "python3",
                  workdir: str | None = None) -> list[str]:
    """The torchrun command line for this node. ``target`` is ``[script, *args]`` or ``['-m', module, *args]``.

    With a ``workdir``, each worker's output goes to its own file there, which the bootstrap echoes line by line
    with a ``[default<local rank>]:`` prefix (cloudtrain/node/worker_echo.py), so the lines of several processes never
    run into each other.
    """
    argv = [python, "-m", "torch.distributed.run", "--nnodes", str(cluster.nnodes),
            "--nproc-per-node", str(cluster.nproc_per_node), "--max-restarts", "0"]
    if workdir:
        argv += ["--redirects", "3", "--log-dir", f"{workdir}/worker-logs"]  # not --tee: see worker_echo.py
    if cluster.rdzv == "static":
        argv += ["--node-rank", str(cluster.node_rank), "--master-addr", cluster.master_addr,
                 "--master-port", str(cluster.master_port)]
    else:
        # c10d: node 0 hosts the rendezvous store; ranks follow the agents' (address, pid) order.
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.master_addr}:{cluster.master_port}",
                 "--rdzv-id", job_id, "--rdzv-conf", f"is_host={1 if cluster.node_rank == 0 else 0}"]
    if cluster.local_addr:
        argv += ["--local-addr", cluster.local_addr]
    if target[:1] == ["-m"]:
        argv += ["--module", *target[1:]]
    else:
        argv += target
    return argv


# == the runner half: what only a node does ========================================================================

# -- the bundle ----------------------------------------------------------------------------------------


def fetch_bundle(bundle: str) -> Path:
    """A node only ever reads its bundle from a local path: providers mount or download it before we start."""
    path = Path(bundle[len("file://"):]) if bundle.startswith("file://") else Path(bundle)
    try:
        path = path / "bundle.tar.gz" if path.is_dir() else path
        if not path.is_file():
            raise BootstrapError(f"bundle {bundle} not found")
        open(path, "rb").close()  # readable now, rather than half-way through unpacking
    except (OSError, ValueError) as exc:  # unreadable, a name too long, a NUL byte ...
        raise BootstrapError(f"bundle {bundle} cannot be read: {exc}") from None
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _member_path(name: str, dest: Path, is_dir: bool) -> Path | None:
    """Where member ``name`` goes under ``dest`` (None: './' itself); no nameless files, no way out of ``dest``."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts and not is_dir:
        raise BootstrapError(f"bundle member {name!r} is a file without a name")
    target = dest.joinpath(*parts) if parts else None
    resolved = target.resolve() if target else dest
    inside = resolved == dest or dest in resolved.parents  # Path.is_relative_to is 3.9+; nodes may run 3.8
    if "\0" in name or name.startswith("/") or ".." in parts or not inside:
        raise BootstrapError(f"bundle member {name!r} would be written outside {dest}")
    return target


def safe_extract(archive: Path, dest: Path) -> int:
    """Extract only regular files and folders that stay inside ``dest``; refuse anything else before writing. A bundle
    that is not a readable gzip tar or cannot be written out is a BootstrapError; what was written of it is removed."""
    dest = dest.resolve()
    try:
        return _extract(archive, dest)
    except (BootstrapError, tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, BootstrapError):
            raise
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the disk, not the bundle
            raise BootstrapError(f"cannot unpack the bundle: no space left on the disk holding {dest}: free space "
                                 "there, or move the job's working folder to a disk with room") from None
        raise BootstrapError(f"bundle {archive} cannot be unpacked ({type(exc).__name__}: {exc}): truncated, "
                             "corrupt or not a gzip tar; stage it again (submit the job again)") from None


def _extract(archive: Path, dest: Path) -> int:
    total = 0
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        targets: dict[str, Path | None] = {}
        for m in members:
            if not (m.isfile() or m.isdir()):
                raise BootstrapError(f"bundle member {m.name!r} is a link or device; bundles hold plain files only")
            targets[m.name] = _member_path(m.name, dest, m.isdir())
            if m.size > MAX_MEMBER_BYTES:
                raise BootstrapError(f"bundle member {m.name!r} is {m.size} bytes, over the {MAX_MEMBER_BYTES} limit")
            total += m.size
            if total > MAX_TOTAL_BYTES:
                raise BootstrapError(f"bundle expands to more than {MAX_TOTAL_BYTES} bytes")
        dest.mkdir(parents=True, exist_ok=True)
        for m in members:
            target = targets[m.name]
            if target is not None and m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            if target is None or m.isdir():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            with src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
            os.chmod(target, 0o755 if m.mode & 0o100 else 0o644)
    return total


def mask_output(env: dict[str, str]) -> Any:
    """From here on, everything this node prints, and everything the processes it starts print, reaches the node's
    log with secrets masked (cloudtrain/node/log_masking.py, stdlib only, loaded from the bundle just unpacked)."""
    from cloudtrain.node.log_masking import MaskedOutput, Masker

    return MaskedOutput(Masker.from_env(env))


def platform_outputs(contract: Any, env: dict[str, str], start_dir: Path) -> Path | None:
    """The folder the platform uploads itself (the contract's ``outputs``: Azure ML's ./outputs), or None."""
    hook = getattr(contract, "outputs", None)
    return Path(hook(env, start_dir)) if hook else None


# -- running -------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def node_steps() -> Any:
    """cloudtrain/node/steps.py from the bundle's lib/: checkpoints restored and published, logs and outputs copied."""
    import cloudtrain.node.steps as steps

    return steps


def node_watch(env: dict[str, str], workdir: Path, on_force: Any) -> Any:
    """cloudtrain's node watch from the bundle's lib/ (cloudtrain/node/watch.py: the supervisor, the max_idle
    watchdog, rank reports, why workers failed). None for a hand-made bundle without it: the node runs unwatched."""
    try:
        from cloudtrain.node.watch import NodeWatch
    except ImportError:
        return None
    return NodeWatch(env, workdir, on_force)


def spot_notices(contract: Any, env: dict[str, str], workdir: Path) -> tuple[dict[str, str], Any]:
    """cloudtrain/node/spot_notice.py from the bundle's lib/: the workers' checkpoint request file, and the poller of
    the platform's spot notice where its contract names one (else None). Nothing for a hand-made bundle without it."""
    try:
        from cloudtrain.node import spot_notice
    except ImportError:
        return {}, None
    return spot_notice.start(contract, env, workdir)


def worker_echo(workdir: Path) -> Any:
    """cloudtrain/node/worker_echo.py from the bundle's lib/: the workers' log files, echoed into this node's output."""
    from cloudtrain.node.worker_echo import WorkerEcho

    return WorkerEcho(workdir / "worker-logs")


def write_status(path: str | None, status: dict[str, object]) -> str | None:
    """The node's status file; once the bundle is unpacked, by cloudtrain/node/node_files.py (a disk that filled up
    fails the node, and why is returned)."""
    files = sys.modules.get("cloudtrain.node.node_files")
    if files is not None or not path:
        return files.write_status(path, status) if files else None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path + ".tmp").write_text(json.dumps(status, indent=2))
    os.replace(path + ".tmp", path)
    return None


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    user_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, user_args = argv[:split], argv[split + 1:]
    p = argparse.ArgumentParser(prog="bootstrap.py", description="cloudtrain in-node bootstrap")
    p.add_argument("--bundle", required=True, help="bundle.tar.gz path or file:// URI (or its folder)")
    p.add_argument("--digest", help="expected sha256:<hex> of the bundle")
    p.add_argument("--workdir", required=True, help="where the bundle is unpacked")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--script")
    target.add_argument("--module")
    p.add_argument("--nproc-per-node", default="auto")
    p.add_argument("--job-id", default="cloudtrain")
    p.add_argument("--requirements-file")
    p.add_argument("--requirement", action="append", default=[])
    p.add_argument("--resume-arg", action="append", default=[], metavar="ARG",
                   help="added to the script's arguments when a checkpoint was restored (write --resume-arg=--x)")
    p.add_argument("--status-file", help="write the node's outcome here as JSON")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="export to the workers; for values only the platform's command line can resolve "
                        "(Azure ML substitutes ${{inputs.x}} in the command, not in environment variables)")
    p.add_argument("--node-contract", default=PLAIN_CONTRACT, metavar="PATH",
                   help="the platform's node contract module, as a path under the bundle's lib/ (default: "
                        "cloudtrain's own, the local provider's)")
    return p.parse_args(argv), user_args


def main(argv: list[str] | None = None) -> int:
    with contextlib.ExitStack() as output:  # the masked output, entered once the bundle is unpacked, ends last
        return run_node(argv, output)


def run_node(argv: list[str] | None, output: contextlib.ExitStack) -> int:
    args, user_args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    for item in args.env:
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    started = time.time()
    status: dict[str, object] = {"outcome": "failed", "returncode": None, "started": started}
    early_stop: list[int] = []  # a SIGTERM while unpacking or restoring still means "preempted", not "failed"
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early_stop.append(signum))
    contract: Any = None  # the platform's node contract, once the bundle that carries it is unpacked
    try:
        workdir = Path(args.workdir).resolve()
        bundle = fetch_bundle(args.bundle)
        if args.digest and sha256_of(bundle) != args.digest:
            raise BootstrapError(f"bundle {bundle} does not match its digest {args.digest}: altered or truncated")
        unpacked = workdir / "bundle"
        if unpacked.exists():
            shutil.rmtree(unpacked)
        safe_extract(bundle, unpacked)
        sys.path.insert(0, str(unpacked / "lib"))  # cloudtrain's node-side modules, imported below from the bundle
        from cloudtrain.node import node_files, process_tree

        node_files.reserve(args.status_file)  # the status file's room, held: a disk the job fills cannot take it
        process_tree.become_subreaper()  # what the job leaves behind comes back to this process, to be ended
        masking = output.enter_context(mask_output(env))
        contract = load_contract(unpacked / "lib" / args.node_contract)
        cluster = detect_cluster(contract, env, args.nproc_per_node)
        status["cluster"] = asdict(cluster)
        log(f"node {cluster.node_rank}/{cluster.nnodes} on {cluster.platform}: {cluster.nproc_per_node} processes, "
            f"rendezvous {cluster.rdzv} at {cluster.master_addr}:{cluster.master_port}")
        from cloudtrain.node import events  # the job's timeline: this node is up (its log carries it to status)
        events.emit("node_started", rank=cluster.node_rank, nodes=cluster.nnodes, platform=cluster.platform)

        echo = worker_echo(workdir)  # runs of an earlier attempt in workdir are not echoed again

        def forced(reason: str) -> None:  # the node ends now (os._exit): say why, and let the last lines out
            write_status(args.status_file, {**status, "outcome": "failed", "reason": reason, "ended": time.time()})
            echo.finish()
            masking.close()

        watch = node_watch(env, workdir, forced)
        src, site = unpacked / "src", workdir / "site-packages"
        from cloudtrain.node import prepare

        failed = prepare.install_requirements(src, site, args.requirements_file, args.requirement, env)
        if failed:
            raise BootstrapError(failed)
        python_path = [str(unpacked / "lib"), str(src), str(site)]
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        uploaded = platform_outputs(contract, env, Path.cwd())  # a folder the platform uploads itself
        env.update({
            "PYTHONPATH": os.pathsep.join(python_path),
            "PYTHONUNBUFFERED": "1",
            NNODES: str(cluster.nnodes),
            NODE_RANK: str(cluster.node_rank),
            PLATFORM: cluster.platform,
            JOB_ID: args.job_id,
            # checkpoint.dir is relative to the script's working folder
            CHECKPOINT_DIR: str(src / (env.get(CHECKPOINT_DIR) or workdir / "checkpoints")),
            OUTPUT_DIR: env.get(OUTPUT_DIR) or str(uploaded or workdir / "outputs"),
        })
        outputs = Path(env[OUTPUT_DIR])
        outputs.mkdir(parents=True, exist_ok=True)
        if uploaded is not None:  # the platform uploads that folder (Azure ML: to the workspace's datastore)
            env.setdefault(OUTPUT_URI, outputs.resolve().as_uri())  # so node logs go there too
            if not (src / "outputs").exists():
                (src / "outputs").symlink_to(outputs.resolve())  # a script's own ./outputs is that folder
        env.update(launcher_env(contract, cluster, env))
        steps = node_steps()
        earlier = steps.fresh_checkpoint_folder(env, workdir)
        failed = steps.restore_checkpoint(env, src, earlier)
        if failed:
            raise BootstrapError(failed)
        if env.get(RESTORED_STEP, "none") != "none":
            user_args += args.resume_arg
        user_args = prepare.expand_args(user_args, env)
        target = [args.script, *user_args] if args.script else ["-m", args.module, *user_args]
        argv_ = torchrun_argv(reachable(cluster, env), target, args.job_id, python=sys.executable,
                              workdir=str(workdir))
        started_files = steps.working_files(src)
        if early_stop:
            code, stopped = EXIT_PREEMPTED, True
        else:
            log("torchrun: " + " ".join(argv_[1:]))
            from cloudtrain.node import torchrun

            syncer = steps.start_checkpoint_sync(env, src, cluster.node_rank,
                                                 world_size=cluster.nnodes * cluster.nproc_per_node)
            extra = watch.torchrun_started() if watch else {}
            asks, notices = spot_notices(contract, env, workdir)  # checkpoint before the reclaim
            echo.start()
            try:
                code, stopped = torchrun.run(argv_, src, {**env, **extra, **asks}, early_stop)
            finally:
                echo.finish()  # at once: what the workers wrote last, before anything the node says after
                if notices:
                    notices.stop()
            if watch:
                watch.torchrun_ended()
            leftovers = process_tree.end_leftovers_said(log)  # none outlives its node, on success too
            sync_error = steps.finish_checkpoint_sync(syncer, env, src)
            if sync_error:
                status["error"] = sync_error
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
    except (BootstrapError, OSError) as exc:  # an OSError only where the disk filled up (node_files says it)
        files: Any = sys.modules.get("cloudtrain.node.node_files")
        if not isinstance(exc, BootstrapError) and not (files and files.disk_full(exc)):
            raise
        why = str(exc) if isinstance(exc, BootstrapError) else files.refused(exc, args.workdir)
        log(f"error: {why}")
        if contract is not None:
            report_failure(contract, env, f"cloudtrain: {why}")
        status.update(outcome="failed", error=why, returncode=EXIT_USAGE, ended=time.time())
        write_status(args.status_file, status)
        return EXIT_USAGE
    from cloudtrain.node import outcome

    return outcome.conclude(status, code, stopped, watch, cluster, visible_gpus(env), started,
                            lambda message: report_failure(contract, env, message),
                            lambda done: write_status(args.status_file, done))

if __name__ == "__main__":
    sys.exit(main())
