"""A node derives one ClusterInfo (cloudtrain/node/launch.py) from each platform's own contract, and trains under
each, emulated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cloudtrain import registry
from cloudtrain.errors import NodeStartError
from cloudtrain.node import launch
from tests.conftest import REPO, status_json

CPU = {"CUDA_VISIBLE_DEVICES": ""}
SAGEMAKER, AZUREML, VERTEX = (registry.node_contract(name) for name in ("aws", "azure", "gcp"))


def sagemaker_driver(hosts: list[str], current: str) -> dict:
    """What SageMaker v3's torchrun driver derives: rank = index in the sorted host list, master algo-1:7777."""
    ordered = sorted(hosts)
    return {"nnodes": len(hosts), "node_rank": ordered.index(current), "master_addr": ordered[0],
            "master_port": 7777}


@pytest.mark.parametrize("current", ["algo-1", "algo-2", "algo-3"])
def test_sagemaker_resourceconfig(tmp_path: Path, current: str) -> None:
    config = tmp_path / "input" / "config" / "resourceconfig.json"
    config.parent.mkdir(parents=True)
    hosts = ["algo-3", "algo-1", "algo-2"]  # the file need not list them in order
    config.write_text(json.dumps({"current_host": current, "hosts": hosts, "network_interface_name": "eth0"}))
    cluster = launch.detect_cluster(SAGEMAKER, {**CPU, "SAGEMAKER_BASE_DIR": str(tmp_path)}, "auto")
    assert cluster.platform == "sagemaker" and cluster.rdzv == "static"
    expected = sagemaker_driver(hosts, current)
    assert {k: getattr(cluster, k) for k in expected} == expected
    argv = launch.torchrun_argv(cluster, ["train.py"], "job")
    assert argv[argv.index("--node-rank") + 1] == str(expected["node_rank"])
    assert argv[argv.index("--master-addr") + 1] == "algo-1" and argv[argv.index("--master-port") + 1] == "7777"


def test_sagemaker_env_variables_without_the_file() -> None:
    env = {**CPU, "SAGEMAKER_BASE_DIR": "/nonexistent", "SM_HOSTS": '["algo-2","algo-1"]',
           "SM_CURRENT_HOST": "algo-2"}
    cluster = launch.detect_cluster(SAGEMAKER, env, "4")
    assert (cluster.nnodes, cluster.node_rank, cluster.master_addr, cluster.nproc_per_node) == (2, 1, "algo-1", 4)


def test_azureml_variables() -> None:
    env = {**CPU, "AZUREML_RUN_ID": "r1", "MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "6105", "NODE_RANK": "1",
           "WORLD_SIZE": "3", "SAGEMAKER_BASE_DIR": "/nonexistent"}
    cluster = launch.detect_cluster(AZUREML, env, "auto")
    assert (cluster.platform, cluster.nnodes, cluster.node_rank, cluster.master_addr, cluster.master_port) == (
        "azureml", 3, 1, "10.0.0.4", 6105)


@pytest.mark.parametrize(("task", "rank"), [({"type": "workerpool0", "index": 0}, 0),
                                            ({"type": "workerpool1", "index": 0}, 1),
                                            ({"type": "workerpool1", "index": 2}, 3)])
def test_vertex_cluster_spec_ignores_world_size(task: dict, rank: int) -> None:
    spec = {"cluster": {"workerpool0": ["cmle-wp0-0:2222"], "workerpool1": [f"cmle-wp1-{i}:2222" for i in range(3)]},
            "task": task, "environment": "cloud"}
    # some Vertex containers set WORLD_SIZE to the node count and MASTER_ADDR to something else: never used
    env = {**CPU, "CLUSTER_SPEC": json.dumps(spec), "WORLD_SIZE": "4", "MASTER_ADDR": "wrong",
           "SAGEMAKER_BASE_DIR": "/nonexistent"}
    cluster = launch.detect_cluster(VERTEX, env, "auto")
    assert (cluster.platform, cluster.nnodes, cluster.node_rank, cluster.master_addr, cluster.master_port) == (
        "vertex", 4, rank, "cmle-wp0-0", 2222)


@pytest.mark.parametrize("spec", ["{}", "not json", '{"cluster": {"workerpool0": []}, "task": {"type": "workerpool0", '
                                  '"index": 0}}', '{"cluster": {"workerpool0": ["host-without-port"]}, "task": '
                                  '{"type": "workerpool0", "index": 0}}'])
def test_vertex_bad_cluster_spec(spec: str) -> None:
    with pytest.raises(NodeStartError, match="CLUSTER_SPEC"):
        launch.detect_cluster(VERTEX, {"CLUSTER_SPEC": spec, "SAGEMAKER_BASE_DIR": "/nonexistent"}, "1")


def test_each_contract_module_is_what_its_provider_declares() -> None:
    """The registry's platform names are the contracts' own, and every planned node detects as its rank."""
    for name in registry.BUILTIN:
        decl, module = registry.declaration(name), registry.node_contract(name)
        assert decl.platform_name == module.PLATFORM
        for rank in range(3):
            found = module.detect({**module.planned(3, rank, "job", ""), "SAGEMAKER_BASE_DIR": "/nonexistent"})
            assert (found["nnodes"], found["node_rank"]) == (3, rank)


def shape(torchrun: list[str]) -> dict[str, str]:
    """A torchrun line's options, less what differs between two runs of one spec (ports, folders, job ids)."""
    opts = {torchrun[i]: torchrun[i + 1] for i in range(len(torchrun) - 1) if torchrun[i].startswith("--")}
    return {k: v for k, v in opts.items() if k not in ("--master-port", "--log-dir", "--rdzv-id", "--rdzv-endpoint")}


@pytest.mark.parametrize("platform", ["sagemaker", "azureml", "vertex", None])
def test_emulated_plans_show_the_static_two_node_lines_the_nodes_run(cli, tmp_path: Path, platform: str | None) -> None:
    """Issue 16: `plan --nodes 2 --emulate sagemaker` showed every node as --nnodes 1 ... c10d is_host=1, because
    resourceconfig.json is only written at submit; the nodes ran --nnodes 2 with static ranks."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    planned = cli("plan", str(proj / "train.py"), "--nodes", "2", *(["--emulate", platform] if platform else []),
                  "-o", "json")
    assert planned.returncode == 0, planned.stderr
    for rank, node in enumerate(json.loads(planned.stdout)["nodes"]):
        line = shape(node["torchrun"][1:])
        assert line["--nnodes"] == "2"
        if platform:  # every cloud contract fixes node ranks
            assert line["--node-rank"] == str(rank) and "--rdzv-backend" not in line
        else:  # the plain local contract: c10d, node 0 hosts the store
            assert line["--rdzv-conf"] == f"is_host={int(rank == 0)}"


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["sagemaker", "azureml", "vertex"])
def test_two_nodes_train_under_each_platform_contract(cli, tmp_path: Path, platform: str) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "plain_torchrun.py").write_text((REPO / "entrypoints" / "plain_torchrun.py").read_text())
    flags = ["--nodes", "2", "--procs-per-node", "2", "--emulate", platform]
    planned = cli("plan", str(proj / "plain_torchrun.py"), *flags, "-o", "json")
    assert planned.returncode == 0, planned.stderr
    result = cli("submit", str(proj / "plain_torchrun.py"), *flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "all_reduce ok: True world_size=4" in result.stdout
    for rank, node in enumerate(json.loads(planned.stdout)["nodes"]):
        assert f"[node{rank}] [cloudtrain] node {rank}/2 on {platform}: 2 processes, rendezvous static" in result.stdout
        ran = re.search(rf"\[node{rank}\] \[cloudtrain\] torchrun: (.*)", result.stdout).group(1).split()  # type: ignore[union-attr]
        # the plan's line is the node's, but for this run's own port, job id and folders
        assert shape(node["torchrun"][1:]) == shape(ran), (node["torchrun"], ran)
    handle = re.search(r"submitted (local://\S+)", result.stderr).group(1)  # type: ignore[union-attr]
    assert status_json(cli, handle)["state"] == "succeeded"


@pytest.mark.parametrize("env", [{"SM_HOSTS": "not json", "SM_CURRENT_HOST": "algo-1"}, {"SM_HOSTS": '["algo-1"]'}])
def test_sagemaker_bad_host_configuration(env: dict) -> None:
    with pytest.raises(NodeStartError, match="SageMaker host configuration"):
        launch.detect_cluster(SAGEMAKER, {**env, "SAGEMAKER_BASE_DIR": "/nonexistent"}, "1")
