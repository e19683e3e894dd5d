#!/usr/bin/env python3
"""cloudtrain's in-node bootstrap: the first thing every node of every job runs, locally and in the cloud.

It must run on any image cloudtrain can choose (Python 3.8 and newer, with torch), so it uses the standard
library only, and nothing newer than Python 3.8 has (tests/test_bootstrap.py runs under 3.8 in CI). Steps:
derive this node's place in the cluster from the environment, unpack the source bundle safely, mask secrets in all
output from then on (its own and its children's), install the job's requirements, run ``torchrun`` with the derived
arguments, forward signals to it, and report the outcome (succeeded, failed or preempted) as an exit code, a last
log line and, when asked, a JSON status file.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zlib
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
# Instance types on which SageMaker's own launchers (sagemaker-core's torchrun driver, the training toolkit) turn on
# EFA for NCCL, and its RDMA path: their lists, as of sagemaker-core 2.27.0 (tests/test_launcher_equivalence.py
# checks these against the installed SDK).
SAGEMAKER_EFA_INSTANCES = frozenset({
    "ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
    "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge"})
SAGEMAKER_EFA_RDMA_INSTANCES = frozenset({
    "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge"})


def sagemaker_config(env: dict[str, str]) -> dict[str, Any]:
    """The host's resourceconfig.json (current_host, hosts, current_instance_type, network_interface_name), or
    the same facts from SM_* variables where only those are given."""
    config = Path(env.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / "input" / "config" / "resourceconfig.json"
    try:
        if config.is_file():
            return dict(json.loads(config.read_text()))
        return {"hosts": list(json.loads(env["SM_HOSTS"])), "current_host": env["SM_CURRENT_HOST"],
                "current_instance_type": env.get("SM_CURRENT_INSTANCE_TYPE", ""),
                "network_interface_name": env.get("SM_NETWORK_INTERFACE_NAME", "eth0")}
    except (ValueError, KeyError, TypeError) as exc:
        raise BootstrapError(f"SageMaker host configuration is unreadable: {exc!r}") from None


def detect_sagemaker(env: dict[str, str], nproc: int) -> ClusterInfo:
    """SageMaker: resourceconfig.json (current_host, hosts); ranks follow the sorted host list, master algo-1:7777,
    exactly as SageMaker's torchrun driver derives them."""
    data = sagemaker_config(env)
    try:
        hosts, current = sorted(str(h) for h in data["hosts"]), str(data["current_host"])
    except (KeyError, TypeError) as exc:
        raise BootstrapError(f"SageMaker host configuration is unreadable: {exc!r}") from None
    if current not in hosts:
        raise BootstrapError(f"SageMaker current host {current!r} is not among hosts {hosts}")
    return ClusterInfo(nnodes=len(hosts), node_rank=hosts.index(current), master_addr=hosts[0],
                       master_port=SAGEMAKER_MASTER_PORT, nproc_per_node=nproc, rdzv="static", platform="sagemaker")


def sagemaker_env(env: dict[str, str], cluster: ClusterInfo) -> dict[str, str]:
    """What SageMaker's torchrun driver exports to the processes it starts: the SM_* facts of the host, and the
    network settings (EFA for NCCL on EFA instance types, NCCL over the host's interface, the simple protocol)."""
    data = sagemaker_config(env)
    instance, interface = str(data.get("current_instance_type", "")), str(data.get("network_interface_name", "eth0"))
    hosts = sorted(str(h) for h in data["hosts"])
    found = {"SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": str(data["current_host"]),
             "SM_HOST_COUNT": str(len(hosts)), "SM_CURRENT_HOST_RANK": str(cluster.node_rank),
             "SM_MASTER_ADDR": hosts[0], "SM_MASTER_PORT": str(SAGEMAKER_MASTER_PORT),
             "SM_CURRENT_INSTANCE_TYPE": instance, "SM_NETWORK_INTERFACE_NAME": interface,
             "SM_NUM_GPUS": str(visible_gpus(env)), "SM_MODEL_DIR": "/opt/ml/model",
             "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data",
             "NCCL_SOCKET_IFNAME": interface, "NCCL_PROTO": "simple"}
    if instance in SAGEMAKER_EFA_INSTANCES:
        found["FI_PROVIDER"] = "efa"
    if instance in SAGEMAKER_EFA_RDMA_INSTANCES:
        found.update(FI_EFA_USE_DEVICE_RDMA="1", RDMAV_FORK_SAFE="1")
    return found


def launcher_env(cluster: ClusterInfo, env: dict[str, str]) -> dict[str, str]:
    """The variables the platform's own launcher gives the processes it starts, so scripts written for that
    platform run unchanged here; a variable the job already sets (the spec's env) wins. Azure ML and Vertex start
    the container with theirs already set (MASTER_ADDR/NODE_RANK; CLUSTER_SPEC, AIP_*) and their launchers add
    no network settings of their own: the images carry those."""
    found = sagemaker_env(env, cluster) if cluster.platform == "sagemaker" else {}
    return {key: value for key, value in found.items() if key not in env}


def report_failure(env: dict[str, str], message: str) -> None:
    """Where the platform reads a failed job's reason: SageMaker's /opt/ml/output/failure becomes
    DescribeTrainingJob's FailureReason (first 1024 characters). Azure ML and Vertex show the exit code and the
    log, whose last line the bootstrap writes. Best effort."""
    if detect_platform(env) != "sagemaker":
        return
    target = Path(env.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / "output" / "failure"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(message[:1024])
    except OSError as exc:
        log(f"warning: could not write {target}: {exc}")


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


def node_storage(env: dict[str, str]) -> Any:
    """cloudtrain's storage steps on a node (restore, the plain-script checkpoint sync, logs and outputs), run in this
    process from the bundle's lib/ (cloudtrain/node_storage.py) rather than as Python processes of their own; the
    job's PYTHONPATH (lib, src, site-packages) is what those processes saw, storage clients included."""
    for path in reversed([p for p in env["PYTHONPATH"].split(os.pathsep) if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
    from cloudtrain import node_storage as steps

    return steps


# Set for the workers once this node restored (the step, or "none"): cloudtrain's Checkpointer then loads that step
# without listing the store again (cloudtrain.checkpoints.RESTORED_ENV).
RESTORED_ENV = "CLOUDTRAIN_RESTORED_STEP"


def restore_checkpoint(env: dict[str, str], cwd: Path) -> None:
    """Bring the newest complete checkpoint into CLOUDTRAIN_CHECKPOINT_DIR before any worker starts."""
    uri = env.get("CLOUDTRAIN_CHECKPOINT_URI")
    if not uri:
        return
    started = time.monotonic()
    try:
        report = node_storage(env).restore(env, cwd)
    except Exception as exc:  # a bundle without cloudtrain's lib/, a storage client that breaks: the node stops
        raise BootstrapError(f"restoring checkpoints from {uri} failed: {exc!r}") from None
    if report.get("error"):
        raise BootstrapError(f"restoring checkpoints from {uri} failed: {report['error']}")
    step = report.get("step")
    env[RESTORED_ENV] = "none" if step is None else str(step)
    took = f" ({time.monotonic() - started:.1f}s)"
    log(f"checkpoint: resuming from step {step}{took}" if step is not None else f"checkpoint: none yet under {uri}")


def start_checkpoint_sync(env: dict[str, str], cwd: Path, cluster: ClusterInfo) -> Any:
    """Node 0 publishes the complete step-<N> folders a plain script writes, while it runs."""
    if not env.get("CLOUDTRAIN_CHECKPOINT_URI") or cluster.node_rank != 0:
        return None
    return node_storage(env).PlainSync(env, cwd)


def finish_checkpoint_sync(syncer: Any, env: dict[str, str], cwd: Path) -> str | None:
    """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
    job's checkpoints are not all in the store (which fails the node), or None."""
    return None if syncer is None else syncer.finish()  # type: ignore[no-any-return]


def mask_output(lib: Path, env: dict[str, str]) -> Any:
    """From here on, everything this node prints, and everything the processes it starts print, reaches the node's
    log with secrets masked (cloudtrain/log_masking.py, stdlib only, loaded from the bundle just unpacked)."""
    sys.path.insert(0, str(lib))
    from cloudtrain.log_masking import MaskedOutput, Masker

    return MaskedOutput(Masker.from_env(env))


def upload_logs(env: dict[str, str], cwd: Path, workdir: Path, cluster: ClusterInfo, masker: Any = None) -> str | None:
    """Each node's worker logs go to the job's outputs (``<output>/logs/node-<rank>``), where `cloudtrain outputs`
    finds them on every platform. Best effort: a node's result never depends on it; a failure is returned as a
    warning for the status file."""
    output, logs = env.get("CLOUDTRAIN_OUTPUT_URI"), workdir / "worker-logs"
    if logs.is_dir() and masker is not None:  # torchrun wrote the workers' output there, unmasked
        masker.mask_tree(logs)
    if not output or not logs.is_dir():
        return None
    target = f"{output.rstrip('/')}/logs/node-{cluster.node_rank}"
    return node_storage(env).upload_logs(env, logs, target)  # type: ignore[no-any-return]


def output_dir(cluster: ClusterInfo, env: dict[str, str], workdir: Path, start_dir: Path) -> Path:
    """The local folder a plain script writes its outputs to (CLOUDTRAIN_OUTPUT_DIR), copied to the job's output
    location when the node ends. On Azure ML it is the job's own ./outputs, which Azure ML uploads too."""
    if env.get("CLOUDTRAIN_OUTPUT_DIR"):
        return Path(env["CLOUDTRAIN_OUTPUT_DIR"])
    return start_dir / "outputs" if cluster.platform == "azureml" else workdir / "outputs"


def upload_outputs(env: dict[str, str], cwd: Path, cluster: ClusterInfo) -> None:
    """Copy CLOUDTRAIN_OUTPUT_DIR to the output location (node 0 at its root, node N under node-N/), after the
    workers ended: at exit and after a preemption. Best effort, like the logs."""
    output, folder = env.get("CLOUDTRAIN_OUTPUT_URI"), Path(env["CLOUDTRAIN_OUTPUT_DIR"])
    if not output or not folder.is_dir() or not any(folder.iterdir()):
        return
    target = output.rstrip("/") + ("" if cluster.node_rank == 0 else f"/node-{cluster.node_rank}")
    if target.startswith("file://") and Path(target[len("file://"):]).resolve() == folder.resolve():
        return  # the folder is the output location (a mount): nothing to copy
    node_storage(env).upload_outputs(env, folder, target)


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
        masking = output.enter_context(mask_output(unpacked / "lib", env))

        def forced(reason: str) -> None:  # the node ends now (os._exit): say why, and let the last lines out
            write_status(args.status_file, {**status, "outcome": "failed", "reason": reason, "ended": time.time()})
            masking.close()

        watch = node_watch(unpacked / "lib", env, workdir, forced)
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
            CLOUDTRAIN_OUTPUT_DIR=str(output_dir(cluster, env, workdir, Path.cwd())),
        )
        outputs = Path(env["CLOUDTRAIN_OUTPUT_DIR"])
        outputs.mkdir(parents=True, exist_ok=True)
        if cluster.platform == "azureml":  # Azure ML uploads the job's ./outputs to the workspace's default datastore
            env.setdefault("CLOUDTRAIN_OUTPUT_URI", outputs.resolve().as_uri())  # so node logs go there too
            if not (src / "outputs").exists():
                (src / "outputs").symlink_to(outputs.resolve())  # a script's own ./outputs is that folder
        env.update(launcher_env(cluster, env))
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
            sync_error = finish_checkpoint_sync(syncer, env, src)
            if sync_error:
                status["error"] = sync_error
            log_warning = upload_logs(env, src, workdir, cluster, masking.masker)
            if log_warning:
                status["warnings"] = [log_warning]
            upload_outputs(env, src, cluster)
    except BootstrapError as exc:
        log(f"error: {exc}")
        report_failure(env, f"cloudtrain: {exc}")
        status.update(outcome="failed", error=str(exc), returncode=EXIT_USAGE, ended=time.time())
        write_status(args.status_file, status)
        return EXIT_USAGE
    # torchrun exits 1 after forwarding SIGTERM even when every worker saved and exited cleanly: a stop we were
    # asked for is "preempted", whatever its exit code; one the node decided on (supervisor gone, idle) failed it.
    # A job whose checkpoints did not reach the store has not succeeded (status["error"] says where they are); a
    # preempted one restarts from the last published.
    if watch and watch.reason:
        outcome = "failed"
    elif stopped:
        outcome = "preempted"
    else:
        outcome = "succeeded" if code == 0 and "error" not in status else "failed"
    status.update(outcome=outcome, returncode=code, ended=time.time(), **(watch.findings(
        outcome, visible_gpus(env)) if watch else {}))
    if outcome == "failed":
        why = status.get("reason") or status.get("error") or (
            f"torchrun exited {code}; the node's log (and its workers' logs in the job's outputs) says why")
        report_failure(env, f"cloudtrain: node {cluster.node_rank} of {cluster.nnodes} failed: {why}")
    write_status(args.status_file, status)
    for key in ("error", "reason", "note", "hint"):  # why it failed, or why its success is hollow: the last lines read
        if status.get(key):
            log(f"node {cluster.node_rank}: {status[key]}")
    took = watch.took(time.time() - started) if watch else f"{time.time() - started:.1f}s"
    log(f"node {cluster.node_rank} {outcome} (torchrun exit {code}) after {took}")
    return {"succeeded": 0, "preempted": EXIT_PREEMPTED}.get(outcome, EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
