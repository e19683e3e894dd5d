from __future__ import annotations

import pytest

from cloudtrain.nodes import bootstrap_module

boot = bootstrap_module()


def test_local_contract_c10d_torchrun_line() -> None:
    env = {"CLOUDTRAIN_NNODES": "2", "CLOUDTRAIN_NODE_RANK": "1", "CLOUDTRAIN_MASTER_ADDR": "127.0.0.1",
           "CLOUDTRAIN_MASTER_PORT": "29555", "CUDA_VISIBLE_DEVICES": ""}
    cluster = boot.detect_cluster(env, "auto")
    assert (cluster.nnodes, cluster.node_rank, cluster.nproc_per_node, cluster.rdzv) == (2, 1, 1, "c10d")
    argv = boot.torchrun_argv(cluster, ["train.py", "--lr", "1"], "job-1", python="py")
    assert argv == ["py", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts",
                    "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29555", "--rdzv-id", "job-1",
                    "--rdzv-conf", "is_host=0", "--local-addr", "localhost", "train.py", "--lr", "1"]
    # node 0 names itself 127.0.0.1, which c10d sorts first: global rank 0 lives on node 0, as on every cloud
    first = boot.detect_cluster({**env, "CLOUDTRAIN_NODE_RANK": "0"}, "auto")
    assert first.local_addr == "127.0.0.1" and sorted(["localhost", first.local_addr])[0] == first.local_addr


def test_static_rendezvous_honours_node_rank_and_module_target() -> None:
    env = {"CLOUDTRAIN_NNODES": "4", "CLOUDTRAIN_NODE_RANK": "3", "CLOUDTRAIN_MASTER_ADDR": "algo-1",
           "CLOUDTRAIN_MASTER_PORT": "7777", "CLOUDTRAIN_RDZV": "static", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    cluster = boot.detect_cluster(env, "auto")
    argv = boot.torchrun_argv(cluster, ["-m", "pkg.train", "x"], "j")
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv[argv.index("--node-rank") + 1] == "3"
    assert argv[argv.index("--master-addr") + 1] == "algo-1"
    assert argv[-3:] == ["--module", "pkg.train", "x"]


@pytest.mark.parametrize(
    ("env", "nproc", "message"),
    [
        ({"CLOUDTRAIN_NNODES": "2", "CLOUDTRAIN_NODE_RANK": "2"}, "1", "outside 0..1"),
        ({"CLOUDTRAIN_NNODES": "two"}, "1", "not an integer"),
        ({}, "0", ">= 1"),
        ({}, "many", "'auto' or an integer"),
    ],
)
def test_bad_node_environment(env: dict, nproc: str, message: str) -> None:
    with pytest.raises(boot.BootstrapError, match=message):
        boot.detect_cluster(env, nproc)
