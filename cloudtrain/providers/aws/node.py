"""SageMaker's node contract: what a SageMaker host gives the container, and how a node reads it (see
cloudtrain/providers/local/node.py for what a contract module is: Python 3.8, the standard library and cloudtrain's
node side).

resourceconfig.json (current_host, hosts, current_instance_type, network_interface_name) under /opt/ml, or the same
facts as SM_* variables; ranks follow the sorted host list, master algo-1:7777, exactly as SageMaker's own torchrun
driver derives them (tests/test_launcher_equivalence.py runs that driver as the oracle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cloudtrain import contract

PLATFORM = "sagemaker"
# Spot notice (cloudtrain/node/spot_notice.py): EC2's instance-action, but off unless CLOUDTRAIN_SPOT_NOTICE=on.
# SageMaker documents no IMDS access from a training container (its credentials come from elsewhere), stops a job
# with SIGTERM and 120 s, and handles managed spot interruptions itself.
SPOT_NOTICE, SPOT_NOTICE_ON = "ec2", False
MASTER_PORT = 7777  # what SageMaker's own torchrun driver uses
# Instance types on which SageMaker's own launchers (sagemaker-core's torchrun driver, the training toolkit) turn on
# EFA for NCCL, and its RDMA path: their lists, as of sagemaker-core 2.27.0 (tests/test_launcher_equivalence.py
# checks these against the installed SDK).
EFA_INSTANCES = frozenset({
    "ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
    "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge"})
EFA_RDMA_INSTANCES = frozenset({
    "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge"})


def _base(env: dict[str, str]) -> Path:
    return Path(env.get("SAGEMAKER_BASE_DIR", "/opt/ml"))


def host_config(env: dict[str, str]) -> dict[str, Any]:
    """The host's resourceconfig.json, or the same facts from SM_* variables where only those are given."""
    config = _base(env) / "input" / "config" / "resourceconfig.json"
    try:
        if config.is_file():
            return dict(json.loads(config.read_text()))
        return {"hosts": list(json.loads(env["SM_HOSTS"])), "current_host": env["SM_CURRENT_HOST"],
                "current_instance_type": env.get("SM_CURRENT_INSTANCE_TYPE", ""),
                "network_interface_name": env.get("SM_NETWORK_INTERFACE_NAME", "eth0")}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"SageMaker host configuration is unreadable: {exc!r}") from None


def detect(env: dict[str, str]) -> dict[str, Any]:
    data = host_config(env)
    try:
        hosts, current = sorted(str(h) for h in data["hosts"]), str(data["current_host"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"SageMaker host configuration is unreadable: {exc!r}") from None
    if current not in hosts:
        raise ValueError(f"SageMaker current host {current!r} is not among hosts {hosts}")
    return {"nnodes": len(hosts), "node_rank": hosts.index(current), "master_addr": hosts[0],
            "master_port": MASTER_PORT, "rdzv": "static"}


def launcher_env(cluster: dict[str, Any], env: dict[str, str], gpus: int) -> dict[str, str]:
    """What SageMaker's torchrun driver exports to the processes it starts: the SM_* facts of the host, and the
    network settings (EFA for NCCL on EFA instance types, NCCL over the host's interface, the simple protocol)."""
    data = host_config(env)
    instance, interface = str(data.get("current_instance_type", "")), str(data.get("network_interface_name", "eth0"))
    hosts = sorted(str(h) for h in data["hosts"])
    found = {"SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": str(data["current_host"]),
             "SM_HOST_COUNT": str(len(hosts)), "SM_CURRENT_HOST_RANK": str(cluster["node_rank"]),
             "SM_MASTER_ADDR": hosts[0], "SM_MASTER_PORT": str(MASTER_PORT),
             "SM_CURRENT_INSTANCE_TYPE": instance, "SM_NETWORK_INTERFACE_NAME": interface,
             "SM_NUM_GPUS": str(gpus), "SM_MODEL_DIR": "/opt/ml/model", "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data",
             "NCCL_SOCKET_IFNAME": interface, "NCCL_PROTO": "simple"}
    if instance in EFA_INSTANCES:
        found["FI_PROVIDER"] = "efa"
    if instance in EFA_RDMA_INSTANCES:
        found.update(FI_EFA_USE_DEVICE_RDMA="1", RDMAV_FORK_SAFE="1")
    return found


def report_failure(env: dict[str, str], message: str) -> None:
    """/opt/ml/output/failure becomes DescribeTrainingJob's FailureReason (its first 1024 characters)."""
    target = _base(env) / "output" / "failure"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(message[:1024])


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    """What host algo-<rank+1> tells the plan (as SM_* variables: resourceconfig.json exists only on the host)."""
    hosts = [f"algo-{i + 1}" for i in range(nnodes)]
    return {"SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": hosts[rank], "SM_CURRENT_INSTANCE_TYPE": instance_type,
            "SM_NETWORK_INTERFACE_NAME": "<the host's>"}


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """SageMaker's contract on this machine: the host's resourceconfig.json under its own /opt/ml; algo-1:7777 does
    not resolve here, so the rendezvous is redirected to 127.0.0.1:port (CLOUDTRAIN_MASTER_OVERRIDE)."""
    base = node_dir / "opt-ml"
    hosts = [f"algo-{i + 1}" for i in range(nnodes)]
    config = {"current_host": hosts[rank], "hosts": hosts, "network_interface_name": "lo",
              "current_instance_type": "local"}
    env = {"SAGEMAKER_BASE_DIR": str(base), contract.MASTER_OVERRIDE: f"127.0.0.1:{port}"}
    return env, {str(base / "input" / "config" / "resourceconfig.json"): json.dumps(config)}
