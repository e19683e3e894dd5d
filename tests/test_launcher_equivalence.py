"""Each node's torchrun line and network environment against the platform's own launcher, for 1, 2, 3, 4, 8 (and
12) nodes.

SageMaker: the oracle is the SDK's own container driver (sagemaker-core's ``container_drivers``: ``environment.py``
derives SM_* from resourceconfig.json, ``torchrun_driver.py`` sets the network variables and builds the command), run
unmodified in a subprocess. Azure ML and Vertex ship no launcher source: the oracle is their documented contract
(Azure ML's PyTorch distribution with one process per node sets MASTER_ADDR, MASTER_PORT=6105, NODE_RANK and
WORLD_SIZE = nodes; Vertex sets CLUSTER_SPEC with hosts named ``cmle-training-workerpool<N>-<id>-<i>:2222``, and
for PyTorch also MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE counting nodes).
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import registry
from cloudtrain.node import launch

SAGEMAKER, AZUREML, VERTEX = (registry.node_contract(name) for name in ("aws", "azure", "gcp"))
NODE_COUNTS = (1, 2, 3, 4, 8, 12)
NETWORK = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "RDMAV_FORK_SAFE", "NCCL_SOCKET_IFNAME", "NCCL_PROTO")
INSTANCES = {"ml.p4d.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.g5.48xlarge": 8, "ml.g4dn.12xlarge": 4,
             "ml.g5.xlarge": 1, "ml.m5.xlarge": 0}

ORACLE = r'''
import json, os, sys, tempfile
drivers, cases = sys.argv[1], json.loads(sys.argv[2])
sys.path[:0] = [drivers, os.path.join(drivers, "distributed_drivers"), os.path.join(drivers, "scripts")]
import environment, torchrun_driver
from common import utils
clean, found = dict(os.environ, TRAINING_JOB_NAME="job"), []  # SageMaker sets it in every container
spool = tempfile.TemporaryDirectory()  # removed at exit (a folder a case was left in the temp dir)
for case in cases:
    os.environ.clear()
    os.environ.update(clean)
    env_file = os.path.join(spool.name, "sm_training.env")
    environment.set_env(case["resource_config"], {}, {}, output_file=env_file)
    for line in open(env_file):
        key, _, value = line[len("export "):].rstrip("\n").partition("=")
        os.environ[key] = value[1:-1]
    os.environ["SM_NUM_GPUS"] = str(case["gpus"])  # what nvidia-smi would count on that instance
    os.environ.update(SM_ENTRY_SCRIPT="train.py", SM_HPS=json.dumps({"lr": "0.1"}),
                      SM_DISTRIBUTED_CONFIG=json.dumps({"process_count_per_node": None}))
    torchrun_driver.setup_env()
    found.append({"command": torchrun_driver.create_commands(),
                  "env": {k: os.environ[k] for k in case["network"] if k in os.environ}})
print(json.dumps({"cases": found, "efa": sorted(utils.SM_EFA_NCCL_INSTANCES),
                  "rdma": sorted(utils.SM_EFA_RDMA_INSTANCES)}))
'''


def sagemaker_oracle(cases: list[dict]) -> dict:
    spec = importlib.util.find_spec("sagemaker.core.modules.train.container_drivers")
    assert spec and spec.submodule_search_locations, "sagemaker-core's container drivers are part of the test deps"
    drivers = next(iter(spec.submodule_search_locations))
    result = subprocess.run([sys.executable, "-c", ORACLE, drivers, json.dumps(cases)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.splitlines()[-1]))


def options(argv: list[str]) -> dict[str, str]:
    """torchrun's options as name -> value, whichever spelling (``--nproc_per_node=8`` or ``--nproc-per-node 8``)."""
    found, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        name, eq, value = argv[i][2:].replace("_", "-").partition("=")
        if eq:
            found[name], i = value, i + 1
        else:
            found[name], i = argv[i + 1], i + 2
    return found


def split_torchrun(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """(options, [script, *args]) of a torchrun command, ours (python -m torch.distributed.run) or the driver's."""
    start = argv.index("torch.distributed.run") + 1 if "torch.distributed.run" in argv else argv.index("torchrun") + 1
    rest = argv[start:]
    opts = options(rest)
    tail = rest[next(i for i, a in enumerate(rest) if a == "train.py"):]
    return opts, tail


@pytest.mark.parametrize("instance", sorted(INSTANCES))
def test_sagemaker_nodes_match_sagemakers_own_torchrun_driver(instance: str, tmp_path: Path) -> None:
    rng = random.Random(instance)
    cases, ours = [], []
    for nodes in NODE_COUNTS:
        hosts = [f"algo-{i + 1}" for i in range(nodes)]
        listed = rng.sample(hosts, len(hosts))  # whatever order resourceconfig lists them in
        interface = "eth0" if nodes == 1 else "ethwe"
        for host in hosts:
            config = {"current_host": host, "current_instance_type": instance, "hosts": listed,
                      "current_group_name": "homogeneousCluster", "network_interface_name": interface}
            cases.append({"resource_config": config, "gpus": INSTANCES[instance], "network": list(NETWORK)})
            base = tmp_path / f"{nodes}-{host}"
            (base / "input" / "config").mkdir(parents=True)
            (base / "input" / "config" / "resourceconfig.json").write_text(json.dumps(config))
            env = {"SAGEMAKER_BASE_DIR": str(base),
                   "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(INSTANCES[instance]))}
            cluster = launch.detect_cluster(SAGEMAKER, env, "auto")
            ours.append((launch.torchrun_argv(cluster, ["train.py", "--lr", "0.1"], "job", python="python3"),
                         launch.launcher_env(SAGEMAKER, cluster, env)))
    oracle = sagemaker_oracle(cases)
    assert set(oracle["efa"]) == SAGEMAKER.EFA_INSTANCES
    assert set(oracle["rdma"]) == SAGEMAKER.EFA_RDMA_INSTANCES
    assert len(oracle["cases"]) == len(ours) == sum(NODE_COUNTS)
    for case, expected, (argv, env) in zip(cases, oracle["cases"], ours, strict=True):
        theirs, their_target = split_torchrun(expected["command"])
        mine, my_target = split_torchrun(argv)
        assert my_target == their_target == ["train.py", "--lr", "0.1"]
        assert mine["nnodes"] == theirs["nnodes"] and mine["nproc-per-node"] == theirs["nproc-per-node"]
        if "node-rank" in theirs:  # the driver names the rendezvous only for several nodes; static always here
            assert (mine["node-rank"], mine["master-addr"], mine["master-port"]) == \
                (theirs["node-rank"], theirs["master-addr"], theirs["master-port"]), case["resource_config"]
        else:
            assert mine["node-rank"] == "0" and mine["nnodes"] == "1"
        assert {k: v for k, v in env.items() if k in NETWORK} == expected["env"]
        assert env["SM_CURRENT_HOST_RANK"] == mine["node-rank"] and env["SM_MASTER_PORT"] == theirs.get(
            "master-port", "7777")


def test_the_jobs_own_network_settings_win_over_the_launchers(tmp_path: Path) -> None:
    config = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "current_instance_type": "ml.p4d.24xlarge",
              "network_interface_name": "ethwe"}
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "resourceconfig.json").write_text(json.dumps(config))
    env = {"SAGEMAKER_BASE_DIR": str(tmp_path), "NCCL_PROTO": "LL128", "CUDA_VISIBLE_DEVICES": ""}
    added = launch.launcher_env(SAGEMAKER, launch.detect_cluster(SAGEMAKER, env, "auto"), env)
    assert "NCCL_PROTO" not in added and added["FI_PROVIDER"] == "efa" and added["NCCL_SOCKET_IFNAME"] == "ethwe"


@pytest.mark.parametrize("nodes", NODE_COUNTS)
def test_azureml_nodes_follow_its_pytorch_distribution_contract(nodes: int) -> None:
    for rank in range(nodes):
        # what Azure ML sets on each node with PyTorchDistribution(process_count_per_instance=1)
        env = {"AZUREML_RUN_ID": "job", "MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "6105", "NODE_RANK": str(rank),
               "WORLD_SIZE": str(nodes), "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
        cluster = launch.detect_cluster(AZUREML, env, "auto")
        mine, target = split_torchrun(launch.torchrun_argv(cluster, ["train.py"], "job"))
        assert mine == {"nnodes": str(nodes), "nproc-per-node": "8", "max-restarts": "0", "node-rank": str(rank),
                        "master-addr": "10.0.0.4", "master-port": "6105"} and target == ["train.py"]
        assert launch.launcher_env(AZUREML, cluster, env) == {}  # Azure ML's launcher adds nothing beyond the contract


@pytest.mark.parametrize("nodes", NODE_COUNTS)
def test_vertex_nodes_follow_cluster_spec_with_vertex_host_names(nodes: int) -> None:
    primary = ["cmle-training-workerpool0-ab12cd34ef-0:2222"]
    workers = [f"cmle-training-workerpool1-ab12cd34ef-{i}:2222" for i in range(nodes - 1)]
    cluster_spec = {"workerpool0": primary, **({"workerpool1": workers} if workers else {})}
    for rank in range(nodes):
        task = {"type": "workerpool0", "index": 0} if rank == 0 else {"type": "workerpool1", "index": rank - 1}
        env = {"CLUSTER_SPEC": json.dumps({"cluster": cluster_spec, "task": task, "environment": "cloud",
                                           "job": "{}"}),
               # what Vertex also sets for PyTorch, counting nodes; the node derives the same from CLUSTER_SPEC
               "MASTER_ADDR": primary[0].split(":")[0], "MASTER_PORT": "2222", "RANK": str(rank),
               "WORLD_SIZE": str(nodes), "CUDA_VISIBLE_DEVICES": "0,1"}
        cluster = launch.detect_cluster(VERTEX, env, "auto")
        mine, _ = split_torchrun(launch.torchrun_argv(cluster, ["train.py"], "job"))
        assert (mine["nnodes"], mine["node-rank"], mine["master-addr"], mine["master-port"], mine["nproc-per-node"]) \
            == (env["WORLD_SIZE"], env["RANK"], env["MASTER_ADDR"], env["MASTER_PORT"], "2")
