#!/usr/bin/env python3
"""cloudtrain's in-node bootstrap: the first thing every node of every job runs, locally and in the cloud.

It must run on any image with Python 3.10+ and torch, so it uses the standard library only. Steps:
derive this node's place in the cluster from the environment, unpack the source bundle safely, install the job's
requirements, run ``torchrun`` with the derived arguments, forward signals to it, and report the outcome
(succeeded, failed or preempted) as an exit code, a last log line and, when asked, a JSON status file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM: what a container stopped by SIGTERM reports
MAX_MEMBER_BYTES = 8 * 1024**3
MAX_TOTAL_BYTES = 32 * 1024**3


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


def _int_env(env: dict[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise BootstrapError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise BootstrapError(f"environment variable {name}={raw!r} is not an integer") from None


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


def detect_local(env: dict[str, str], nproc: int) -> ClusterInfo:
    """cloudtrain's local contract: the local provider sets CLOUDTRAIN_* for each simulated node.

    c10d ranks the agents by (address, pid). Every simulated node is on 127.0.0.1, so node 0 names itself by that
    address and the others as 'localhost' (which sorts after it): global rank 0 then lives on node 0, as on every
    cloud, where node 0 is the one that publishes a plain script's checkpoints. Only rank 0's address is ever
    connected to."""
    node_rank = _int_env(env, "CLOUDTRAIN_NODE_RANK", 0)
    return ClusterInfo(
        nnodes=_int_env(env, "CLOUDTRAIN_NNODES", 1),
        node_rank=node_rank,
        master_addr=env.get("CLOUDTRAIN_MASTER_ADDR", "127.0.0.1"),
        master_port=_int_env(env, "CLOUDTRAIN_MASTER_PORT", 29500),
        nproc_per_node=nproc,
        rdzv=env.get("CLOUDTRAIN_RDZV", "c10d"),
        platform="local",
        local_addr=env.get("CLOUDTRAIN_LOCAL_ADDR", "127.0.0.1" if node_rank == 0 else "localhost"),
    )


SAGEMAKER_MASTER_PORT = 7777  # what SageMaker's own torchrun driver uses


def detect_sagemaker(env: dict[str, str], nproc: int) -> ClusterInfo:
    """SageMaker: resourceconfig.json (current_host, hosts); ranks follow the sorted host list, master algo-1:7777,
    exactly as SageMaker's torchrun driver derives them."""
    config = Path(env.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / "input" / "config" / "resourceconfig.json"
    try:
        if config.is_file():
            data = json.loads(config.read_text())
            hosts, current = list(data["hosts"]), str(data["current_host"])
        else:
            hosts, current = list(json.loads(env["SM_HOSTS"])), env["SM_CURRENT_HOST"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BootstrapError(f"SageMaker host configuration is unreadable: {exc!r}") from None
    hosts = sorted(hosts)
    if current not in hosts:
        raise BootstrapError(f"SageMaker current host {current!r} is not among hosts {hosts}")
    return ClusterInfo(nnodes=len(hosts), node_rank=hosts.index(current), master_addr=hosts[0],
                       master_port=SAGEMAKER_MASTER_PORT, nproc_per_node=nproc, rdzv="static", platform="sagemaker")


def detect_azureml(env: dict[str, str], nproc: int) -> ClusterInfo:
    """Azure ML with PyTorchDistribution(process_count_per_instance=1): the service sets MASTER_ADDR, MASTER_PORT and
    NODE_RANK per node, and WORLD_SIZE counts its processes, which is one per node in that layout. cloudtrain's plan
    also sets CLOUDTRAIN_NNODES, preferred where present."""
    nnodes = _int_env(env, "CLOUDTRAIN_NNODES", _int_env(env, "WORLD_SIZE", 1))
    return ClusterInfo(nnodes=nnodes, node_rank=_int_env(env, "NODE_RANK", 0),
                       master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=_int_env(env, "MASTER_PORT", 6105),
                       nproc_per_node=nproc, rdzv="static", platform="azureml")


def detect_vertex(env: dict[str, str], nproc: int) -> ClusterInfo:
    """Vertex AI: everything from CLUSTER_SPEC (workerpool0 = the primary, workerpool1 = the other nodes).
    MASTER_ADDR/WORLD_SIZE are not reliable there, so they are ignored."""
    try:
        spec = json.loads(env["CLUSTER_SPEC"])
        cluster, task = spec["cluster"], spec["task"]
        primary, workers = list(cluster["workerpool0"]), list(cluster.get("workerpool1", []))
        kind, index = task["type"], int(task["index"])
        host, _, port = primary[0].rpartition(":")
        master_port = int(port)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise BootstrapError(f"CLUSTER_SPEC is not a Vertex cluster spec: {exc}") from None
    if kind == "workerpool0":
        rank = index
    elif kind == "workerpool1":
        rank = len(primary) + index
    else:
        raise BootstrapError(f"CLUSTER_SPEC task type {kind!r}: cloudtrain uses workerpool0 and workerpool1 only")
    return ClusterInfo(nnodes=len(primary) + len(workers), node_rank=rank, master_addr=host,
                       master_port=master_port, nproc_per_node=nproc, rdzv="static", platform="vertex")


def detect_platform(env: dict[str, str]) -> str:
    base = Path(env.get("SAGEMAKER_BASE_DIR", "/opt/ml"))
    if (base / "input" / "config" / "resourceconfig.json").is_file() or "SM_HOSTS" in env:
        return "sagemaker"
    if "CLUSTER_SPEC" in env:
        return "vertex"
    if "AZUREML_RUN_ID" in env:
        return "azureml"
    return "local"


DETECTORS = {"sagemaker": detect_sagemaker, "azureml": detect_azureml, "vertex": detect_vertex, "local": detect_local}


def detect_cluster(env: dict[str, str], nproc_request: str = "auto") -> ClusterInfo:
    nproc = resolve_nproc(nproc_request, env)
    cluster = DETECTORS[detect_platform(env)](env, nproc)
    if not 0 <= cluster.node_rank < cluster.nnodes:
        raise BootstrapError(f"node rank {cluster.node_rank} is outside 0..{cluster.nnodes - 1}")
    return cluster


def reachable(cluster: ClusterInfo, env: dict[str, str]) -> ClusterInfo:
    """Where torchrun really connects. Only local emulation sets CLOUDTRAIN_MASTER_OVERRIDE (algo-1:7777 does not
    resolve on a laptop, and fixed ports collide between jobs); on a cloud node it is the derived address."""
    override = env.get("CLOUDTRAIN_MASTER_OVERRIDE")
    if not override:
        return cluster
    host, _, port = override.rpartition(":")
    return replace(cluster, master_addr=host, master_port=int(port), local_addr=host)


def torchrun_argv(cluster: ClusterInfo, target: list[str], job_id: str, python: str = "python3",
                  workdir: str | None = None) -> list[str]:
    """The torchrun command line for this node. ``target`` is ``[script, *args]`` or ``['-m', module, *args]``.

    With a ``workdir``, each worker's output goes to its own file there and is echoed line by line with a
    ``[rank-on-node]:`` prefix, so the lines of several processes never run into each other.
    """
    argv = [python, "-m", "torch.distributed.run", "--nnodes", str(cluster.nnodes),
            "--nproc-per-node", str(cluster.nproc_per_node), "--max-restarts", "0"]
    if workdir:
        argv += ["--tee", "3", "--log-dir", f"{workdir}/worker-logs"]
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


# -- the bundle ----------------------------------------------------------------------------------------


def fetch_bundle(bundle: str) -> Path:
    """A node only ever reads its bundle from a local path: providers mount or download it before we start."""
    path = Path(bundle[len("file://"):]) if bundle.startswith("file://") else Path(bundle)
    if path.is_dir():
        path = path / "bundle.tar.gz"
    if not path.is_file():
        raise BootstrapError(f"bundle {bundle} not found")
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def safe_extract(archive: Path, dest: Path) -> int:
    """Extract only regular files and folders that stay inside ``dest``; refuse anything else before writing."""
    dest = dest.resolve()
    total = 0
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for m in members:
            name = m.name
            target = (dest / name).resolve()
            if name.startswith("/") or ".." in Path(name).parts or not target.is_relative_to(dest):
                raise BootstrapError(f"bundle member {name!r} would be written outside {dest}")
            if not (m.isfile() or m.isdir()):
                raise BootstrapError(f"bundle member {name!r} is a link or device; bundles hold plain files only")
            if m.size > MAX_MEMBER_BYTES:
                raise BootstrapError(f"bundle member {name!r} is {m.size} bytes, over the {MAX_MEMBER_BYTES} limit")
            total += m.size
            if total > MAX_TOTAL_BYTES:
                raise BootstrapError(f"bundle expands to more than {MAX_TOTAL_BYTES} bytes")
        dest.mkdir(parents=True, exist_ok=True)
        for m in members:
            target = dest / m.name
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            with src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
            os.chmod(target, 0o755 if m.mode & 0o100 else 0o644)
    return total


def install_requirements(src: Path, site: Path, file: str | None, specs: list[str]) -> None:
    """Install into a job-private folder, never into the image's (or the user's) environment."""
    if not file and not specs:
        return
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(site)]
    cmd += ["-r", str(src / file)] if file else []
    cmd += specs
    log(f"installing requirements: {' '.join(cmd[4:])}")
    result = subprocess.run(cmd, cwd=src)
    if result.returncode != 0:
        raise BootstrapError(f"pip install failed with exit code {result.returncode}")


def restore_checkpoint(env: dict[str, str], cwd: Path) -> None:
    """Bring the newest complete checkpoint into CLOUDTRAIN_CHECKPOINT_DIR before any worker starts. Runs
    cloudtrain's own restore from the bundle (it may need a storage client; this file stays stdlib-only)."""
    uri = env.get("CLOUDTRAIN_CHECKPOINT_URI")
    if not uri:
        return
    cmd = [sys.executable, "-m", "cloudtrain.checkpoints", "restore", uri, env["CLOUDTRAIN_CHECKPOINT_DIR"]]
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise BootstrapError(f"restoring checkpoints from {uri} failed (exit {result.returncode})")
    step = json.loads(result.stdout or "{}").get("step")
    log(f"checkpoint: resuming from step {step}" if step is not None else f"checkpoint: none yet under {uri}")


def _sync_cmd(env: dict[str, str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "cloudtrain.checkpoints", "sync", env["CLOUDTRAIN_CHECKPOINT_DIR"],
            env["CLOUDTRAIN_CHECKPOINT_URI"], *extra]


def start_checkpoint_sync(env: dict[str, str], cwd: Path, cluster: ClusterInfo) -> subprocess.Popen[bytes] | None:
    """Node 0 publishes the complete step-<N> folders a plain script writes, while it runs."""
    if not env.get("CLOUDTRAIN_CHECKPOINT_URI") or cluster.node_rank != 0:
        return None
    every = env.get("CLOUDTRAIN_CHECKPOINT_INTERVAL") or "60"
    return subprocess.Popen(_sync_cmd(env, "--every", every), cwd=cwd, env=env, stdin=subprocess.DEVNULL)


def finish_checkpoint_sync(syncer: subprocess.Popen[bytes] | None, env: dict[str, str], cwd: Path) -> None:
    """After the workers exited (also after SIGTERM): everything they left is final; publish it."""
    if syncer is None:
        return
    syncer.terminate()
    syncer.wait()
    result = subprocess.run(_sync_cmd(env, "--final"), cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        log(f"warning: final checkpoint sync failed (exit {result.returncode})")


def upload_logs(env: dict[str, str], cwd: Path, workdir: Path, cluster: ClusterInfo) -> None:
    """Each node's worker logs go to the job's outputs (``<output>/logs/node-<rank>``), where `cloudtrain outputs`
    finds them on every platform. Best effort: a node's result never depends on it."""
    output, logs = env.get("CLOUDTRAIN_OUTPUT_URI"), workdir / "worker-logs"
    if not output or not logs.is_dir():
        return
    target = f"{output.rstrip('/')}/logs/node-{cluster.node_rank}"
    cmd = [sys.executable, "-m", "cloudtrain.outputs", "upload-logs", str(logs), target]
    result = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        log(f"warning: copying logs to {target} failed (exit {result.returncode})")


# -- running -------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def run_torchrun(argv: list[str], cwd: Path, env: dict[str, str], early: list[int] | None = None) -> tuple[int, bool]:
    """Run torchrun, forwarding SIGTERM/SIGINT to it. Returns (exit code, whether we were asked to stop).
    ``early``: signals that arrived before the forwarding handler was installed; they are forwarded at once."""
    child = subprocess.Popen(argv, cwd=cwd, env=env)
    stopping = {"signal": None}

    def forward(signum: int, _frame: object) -> None:
        stopping["signal"] = signum  # type: ignore[assignment]
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    if early:  # a stop that landed between the last check and the handler above: not lost
        forward(early[-1], None)
    try:
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for old Pythons
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code, stopping["signal"] is not None


def node_watch(lib: Path, env: dict[str, str], workdir: Path, on_force: Any) -> Any:
    """cloudtrain's node watch from the bundle's lib/ (cloudtrain/node_watch.py: the supervisor, the max_idle
    watchdog, rank reports, why workers failed). None for a hand-made bundle without it: the node runs unwatched."""
    sys.path.insert(0, str(lib))
    try:
        from cloudtrain.node_watch import NodeWatch
    except ImportError:
        return None
    return NodeWatch(env, workdir, on_force)


def write_status(path: str | None, status: dict[str, object]) -> None:
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=2))
    os.replace(tmp, target)


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
    p.add_argument("--status-file", help="write the node's outcome here as JSON")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="export to the workers; for values only the platform's command line can resolve "
                        "(Azure ML substitutes ${{inputs.x}} in the command, not in environment variables)")
    p.add_argument("--dry-run", action="store_true", help="print the ClusterInfo and torchrun line, run nothing")
    return p.parse_args(argv), user_args


def main(argv: list[str] | None = None) -> int:
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
    try:
        cluster = detect_cluster(env, args.nproc_per_node)
        target = [args.script, *user_args] if args.script else ["-m", args.module, *user_args]
        argv_ = torchrun_argv(reachable(cluster, env), target, args.job_id, python=sys.executable,
                              workdir=str(Path(args.workdir).resolve()))
        status["cluster"] = asdict(cluster)
        if args.dry_run:
            print(json.dumps({"cluster": asdict(cluster), "torchrun": argv_}, indent=2))
            return 0
        log(f"node {cluster.node_rank}/{cluster.nnodes} on {cluster.platform}: {cluster.nproc_per_node} processes, "
            f"rendezvous {cluster.rdzv} at {cluster.master_addr}:{cluster.master_port}")
        workdir = Path(args.workdir).resolve()
        bundle = fetch_bundle(args.bundle)
        if args.digest and sha256_of(bundle) != args.digest:
            raise BootstrapError(f"bundle {bundle} does not match its digest {args.digest}: altered or truncated")
        unpacked = workdir / "bundle"
        if unpacked.exists():
            shutil.rmtree(unpacked)
        safe_extract(bundle, unpacked)
        watch = node_watch(unpacked / "lib", env, workdir, lambda reason: write_status(
            args.status_file, {**status, "outcome": "failed", "reason": reason, "ended": time.time()}))
        src, site = unpacked / "src", workdir / "site-packages"
        install_requirements(src, site, args.requirements_file, args.requirement)
        python_path = [str(unpacked / "lib"), str(src), str(site)]
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        env.update(
            PYTHONPATH=os.pathsep.join(python_path),
            PYTHONUNBUFFERED="1",
            CLOUDTRAIN_NNODES=str(cluster.nnodes),
            CLOUDTRAIN_NODE_RANK=str(cluster.node_rank),
            CLOUDTRAIN_PLATFORM=cluster.platform,
            CLOUDTRAIN_JOB_ID=args.job_id,
            CLOUDTRAIN_CHECKPOINT_DIR=env.get("CLOUDTRAIN_CHECKPOINT_DIR") or str(workdir / "checkpoints"),
        )
        restore_checkpoint(env, src)
        if early_stop:
            code, stopped = EXIT_PREEMPTED, True
        else:
            log("torchrun: " + " ".join(argv_[1:]))
            syncer = start_checkpoint_sync(env, src, cluster)
            extra = watch.torchrun_started() if watch else {}
            code, stopped = run_torchrun(argv_, src, {**env, **extra}, early_stop)
            if watch:
                watch.torchrun_ended()
            finish_checkpoint_sync(syncer, env, src)
            upload_logs(env, src, workdir, cluster)
    except BootstrapError as exc:
        log(f"error: {exc}")
        status.update(outcome="failed", error=str(exc), returncode=EXIT_USAGE, ended=time.time())
        write_status(args.status_file, status)
        return EXIT_USAGE
    # torchrun exits 1 after forwarding SIGTERM even when every worker saved and exited cleanly: a stop we were
    # asked for is "preempted", whatever its exit code; one the node decided on (supervisor gone, idle) failed it.
    outcome = "failed" if watch and watch.reason else "preempted" if stopped else "succeeded" if code == 0 else "failed"
    status.update(outcome=outcome, returncode=code, ended=time.time(), **(watch.findings(
        outcome, visible_gpus(env)) if watch else {}))
    write_status(args.status_file, status)
    for key in ("reason", "note", "hint"):  # why it failed, or why its success is hollow: the last lines users read
        if status.get(key):
            log(f"node {cluster.node_rank}: {status[key]}")
    took = watch.took(time.time() - started) if watch else f"{time.time() - started:.1f}s"
    log(f"node {cluster.node_rank} {outcome} (torchrun exit {code}) after {took}")
    return {"succeeded": 0, "preempted": EXIT_PREEMPTED}.get(outcome, EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
