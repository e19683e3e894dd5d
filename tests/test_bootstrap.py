"""The node's start, on its own: the bootstrap's first stage (entrypoints/bootstrap.py: fetch, verify, unpack) and the
launch derivation the node entry runs (cloudtrain/node/launch.py). Every test here also runs under the oldest Python
an image cloudtrain picks can carry (3.8: Azure's torch 1.13 environment), in `nox -s bootstrap`. So this module
imports nothing of cloudtrain's but the bootstrap file and the node-side modules a node runs (standard library only),
and writes nothing newer than Python 3.8 reads."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cloudtrain import contract
from cloudtrain.errors import NodeStartError
from cloudtrain.node import launch
from tests.emulators import free_port
from tests.node_support import REPO, load_bootstrap, make_bundle, node_env

boot = load_bootstrap()
LOCAL = launch.load_contract(REPO / "cloudtrain" / "providers" / "local" / "node.py")  # cloudtrain's own contract


def test_local_contract_c10d_torchrun_line() -> None:
    env = {"CLOUDTRAIN_NNODES": "2", "CLOUDTRAIN_NODE_RANK": "1", "CLOUDTRAIN_MASTER_ADDR": "127.0.0.1",
           "CLOUDTRAIN_MASTER_PORT": "29555", "CUDA_VISIBLE_DEVICES": ""}
    cluster = launch.detect_cluster(LOCAL, env, "auto")
    assert (cluster.nnodes, cluster.node_rank, cluster.nproc_per_node, cluster.rdzv) == (2, 1, 1, "c10d")
    argv = launch.torchrun_argv(cluster, ["train.py", "--lr", "1"], "job-1", python="py")
    assert argv == ["py", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts",
                    "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29555", "--rdzv-id", "job-1",
                    "--rdzv-conf", "is_host=0", "--local-addr", "localhost", "train.py", "--lr", "1"]
    # node 0 names itself 127.0.0.1, which c10d sorts first: global rank 0 lives on node 0, as on every cloud
    first = launch.detect_cluster(LOCAL, {**env, "CLOUDTRAIN_NODE_RANK": "0"}, "auto")
    assert first.local_addr == "127.0.0.1" and sorted(["localhost", first.local_addr])[0] == first.local_addr


def test_static_rendezvous_honours_node_rank_and_module_target() -> None:
    env = {"CLOUDTRAIN_NNODES": "4", "CLOUDTRAIN_NODE_RANK": "3", "CLOUDTRAIN_MASTER_ADDR": "algo-1",
           "CLOUDTRAIN_MASTER_PORT": "7777", "CLOUDTRAIN_RDZV": "static", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    cluster = launch.detect_cluster(LOCAL, env, "auto")
    argv = launch.torchrun_argv(cluster, ["-m", "pkg.train", "x"], "j")
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv[argv.index("--node-rank") + 1] == "3"
    assert argv[argv.index("--master-addr") + 1] == "algo-1"
    assert argv[-3:] == ["--module", "pkg.train", "x"]


def test_workers_write_to_files_the_bootstrap_echoes() -> None:
    """torchrun redirects each worker's output to its own files (cloudtrain/node/worker_echo.py echoes them): its own
    --tee waits up to 0.1 s per file at exit for threads that poll them."""
    cluster = launch.detect_cluster(LOCAL, {"CLOUDTRAIN_NNODES": "1", "CUDA_VISIBLE_DEVICES": ""}, "2")
    argv = launch.torchrun_argv(cluster, ["train.py"], "j", workdir="/w")
    assert argv[argv.index("--redirects") + 1] == "3" and argv[argv.index("--log-dir") + 1] == "/w/worker-logs"
    assert "--tee" not in argv



def test_slurm_contract_under_the_nodes_python() -> None:
    """What an srun task of a Slurm job sees (its GPUs as Slurm's --gpus-per-node gives them), read by Slurm's
    node contract on the node's oldest Python: static ranks from SLURM_NODEID, the first node of the expanded
    SLURM_JOB_NODELIST (its address, where srun gives one) as rendezvous host."""
    slurm = launch.load_contract(REPO / "cloudtrain" / "providers" / "slurm" / "node.py")
    env = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "gpu[09-10],x1",
           "SLURMD_NODENAME": "gpu10", "CUDA_VISIBLE_DEVICES": "0,1"}
    cluster = launch.detect_cluster(slurm, env, "auto")
    assert (cluster.nnodes, cluster.node_rank, cluster.nproc_per_node, cluster.rdzv) == (3, 1, 2, "static")
    argv = launch.torchrun_argv(cluster, ["train.py"], "job")
    assert argv[argv.index("--master-addr") + 1] == "gpu09" and argv[argv.index("--node-rank") + 1] == "1"
    assert slurm.expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    requeued = launch.detect_cluster(slurm, {**env, "SLURM_RESTART_COUNT": "1", "SLURM_LAUNCH_NODE_IPADDR": "10.1.0.9"})
    assert requeued.master_addr == "10.1.0.9" and requeued.master_port == cluster.master_port + 1
    with pytest.raises(NodeStartError, match="SLURMD_NODENAME"):
        launch.detect_cluster(slurm, {**env, "SLURMD_NODENAME": "gpu09"})

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
    with pytest.raises(NodeStartError, match=message):
        launch.detect_cluster(LOCAL, env, nproc)


def test_a_platform_variable_that_is_not_an_integer_is_named() -> None:
    azure = launch.load_contract(REPO / "cloudtrain" / "providers" / "azure" / "node.py")
    with pytest.raises(NodeStartError, match=r"MASTER_PORT='6105x' is not an integer"):
        launch.detect_cluster(azure, {"MASTER_PORT": "6105x"}, "1")


def test_a_bundle_member_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(payload, arcname="src/../../outside.txt")
    with pytest.raises(boot.BootstrapError, match="outside"):
        boot.safe_extract(archive, tmp_path / "dest")
    assert not (tmp_path / "outside.txt").exists()


# -- a whole node, on this interpreter --------------------------------------------------------------------


def _node(tmp_path: Path, bundle: Path, env: dict, *python_flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle",
                           str(bundle), "--workdir", str(tmp_path / "work"), "--script", "train.py",
                           "--nproc-per-node", "1", "--status-file", str(tmp_path / "status.json")],
                          env=env, capture_output=True, text=True, timeout=240)


def test_a_node_that_cannot_start_after_unpacking_says_why_and_exits_as_a_bad_bundle_does(tmp_path: Path) -> None:
    """Its first stage hands a sound bundle over to the node entry the bundle carries; where the node's environment
    gives it no place in the cluster, the node entry ends it with one line, its status and the usage exit code, as
    the first stage ends a node whose bundle is bad (tests/test_bundle_errors.py)."""
    env = {**node_env(tmp_path), "CLOUDTRAIN_NODE_RANK": "1"}
    result = _node(tmp_path, make_bundle(tmp_path, "print('never')\n"), env)
    out = result.stdout + result.stderr
    assert result.returncode == contract.EXIT_USAGE, out
    assert "Traceback" not in out and "never" not in out
    assert "[cloudtrain] error: node rank 1 is outside 0..0" in result.stdout, out
    recorded = json.loads((tmp_path / "status.json").read_text())
    assert (recorded["outcome"], recorded["returncode"]) == ("failed", contract.EXIT_USAGE)
    assert recorded["error"] == "node rank 1 is outside 0..0" and recorded["ended"] >= recorded["started"]


def test_a_bundle_without_cloudtrains_node_side_is_one_clear_error(tmp_path: Path) -> None:
    """A hand-made bundle (only src/) carries no node entry: the first stage says so in one line and exits with the
    usage code, rather than a traceback from an import. Python runs isolated (-I -S), so no cloudtrain installed
    beside it stands in for the bundle's."""
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(script, arcname="src/train.py")
    result = _node(tmp_path, bundle, node_env(tmp_path), "-I", "-S")
    out = result.stdout + result.stderr
    assert result.returncode == contract.EXIT_USAGE and "Traceback" not in out, out
    assert "has no node entry (cloudtrain/node/entry.py" in result.stdout and "stage it again" in result.stdout, out
    recorded = json.loads((tmp_path / "status.json").read_text())
    assert recorded["outcome"] == "failed" and "has no node entry" in recorded["error"]

TRAIN = '''
import os, sys
from pathlib import Path

rank = int(os.environ["RANK"])
# the bundle's sitecustomize ran in this worker and installed cloudtrain's exit guard
assert "cloudtrain.node.exit_guard" in sys.modules, sorted(m for m in sys.modules if m.startswith("cloudtrain"))
step = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]) / "step-000000007"
if rank == 0:
    restored = sorted(p.name for p in Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]).glob("step-*"))
    print("restored %s" % restored, flush=True)  # one string: PYTHONUNBUFFERED writes print's pieces one by one
    step.mkdir(parents=True, exist_ok=True)
    (step / "state.txt").write_text("weights")
    (Path(os.environ["CLOUDTRAIN_OUTPUT_DIR"]) / "model.txt").write_text("final")  # a plain script's output
    print("node restored %s" % os.environ.get("CLOUDTRAIN_RESTORED_STEP"), flush=True)
    if os.path.isdir("/proc"):  # the node's processes, from here: worker -> torchrun -> bootstrap
        def parent(pid):
            stat = Path("/proc/%d/stat" % pid).read_text()
            return int(stat[stat.rindex(")") + 2:].split()[1])
        bootstrap = parent(os.getppid())
        children = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and parent(int(entry)) == bootstrap:
                    children.append(Path("/proc/%s/cmdline" % entry).read_bytes().replace(b"\\0", b" ").decode())
            except OSError:
                continue
        print("bootstrap children %d %s" % (len(children), [c[:80] for c in children]), flush=True)
print("rank %d of %s on Python %s" % (rank, os.environ["WORLD_SIZE"], sys.version_info[:2]), flush=True)
'''


def test_a_node_restores_runs_and_publishes_on_this_python(tmp_path: Path) -> None:
    """unpack, restore, torchrun, checkpoint sync and log upload: every step cloudtrain takes on a node, with
    cloudtrain's own node-side modules from the bundle, on the interpreter running this test (3.8 in CI)."""
    store, out = tmp_path / "store", tmp_path / "out"
    earlier = tmp_path / "earlier" / "step-000000003"  # what a previous attempt left: published by the protocol
    earlier.mkdir(parents=True)
    (earlier / "state.txt").write_text("old")
    seed = subprocess.run([sys.executable, "-m", "cloudtrain.checkpoint", "sync", str(earlier.parent),
                           store.as_uri(), "--final"], cwd=REPO, capture_output=True, text=True)
    assert seed.returncode == 0, seed.stderr
    bundle = make_bundle(tmp_path, TRAIN)
    status = tmp_path / "status.json"
    env = node_env(tmp_path, CLOUDTRAIN_CHECKPOINT_URI=store.as_uri(), CLOUDTRAIN_OUTPUT_URI=out.as_uri())
    result = subprocess.run([sys.executable, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle", str(bundle),
                             "--workdir", str(tmp_path / "work"), "--script", "train.py", "--nproc-per-node", "2",
                             "--status-file", str(status)], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restored ['step-000000003']" in result.stdout
    assert "node restored 3" in result.stdout  # the workers know what their node restored (the Checkpointer's cue)
    if sys.platform.startswith("linux"):  # the checkpoint sync runs in the bootstrap, not as a Python of its own
        assert "bootstrap children 1 " in result.stdout, result.stdout
    assert result.stdout.count(f"on Python {tuple(sys.version_info[:2])}") == 2
    for rank in (0, 1):  # each worker's lines, from its own file, echoed with its local rank (worker_echo.py)
        assert f"[default{rank}]:rank {rank} of 2 on Python" in result.stdout, result.stdout
    assert json.loads(status.read_text())["outcome"] == "succeeded"
    published = store / "step-000000007"
    assert (published / "state.txt").read_text() == "weights" and (published / "manifest.json").is_file()
    assert (out / "model.txt").read_text() == "final"  # the output folder, copied to the output location at exit



FAILS = '''
import os, sys
print("sees", os.environ.get("SM_CURRENT_HOST"), os.environ.get("NCCL_PROTO"), os.environ.get("FI_PROVIDER"),
      os.environ.get("NCCL_SOCKET_IFNAME"), flush=True)
sys.exit(3)
'''


def test_a_failed_sagemaker_node_says_why_in_the_failure_file(tmp_path: Path) -> None:
    """SageMaker turns /opt/ml/output/failure into DescribeTrainingJob's FailureReason; the workers saw the
    variables SageMaker's own launcher sets (EFA on a p4d)."""
    base = tmp_path / "opt-ml"
    (base / "input" / "config").mkdir(parents=True)
    (base / "input" / "config" / "resourceconfig.json").write_text(json.dumps({
        "current_host": "algo-1", "hosts": ["algo-1"], "current_instance_type": "ml.p4d.24xlarge",
        "network_interface_name": "eth0"}))
    env = node_env(tmp_path, SAGEMAKER_BASE_DIR=str(base), CLOUDTRAIN_MASTER_OVERRIDE=f"127.0.0.1:{free_port()}")
    result = subprocess.run([sys.executable, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle",
                             str(make_bundle(tmp_path, FAILS)), "--workdir", str(tmp_path / "work"), "--script",
                             "train.py", "--nproc-per-node", "1",
                             "--node-contract", "cloudtrain/providers/aws/node.py"],
                            env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sees algo-1 simple efa eth0" in result.stdout
    reason = (base / "output" / "failure").read_text()
    assert reason.startswith("cloudtrain: node 0 of 1 failed: torchrun exited")


AZURE_OUTPUTS = '''
import os
from pathlib import Path
Path("outputs").mkdir(exist_ok=True)
(Path("outputs") / ("model-" + os.environ["RANK"] + ".txt")).write_text("final")
'''


def test_on_azure_ml_the_jobs_own_outputs_folder_is_the_output_location(tmp_path: Path) -> None:
    """Azure ML uploads the job's ./outputs to the workspace's default datastore: a job without output_uri keeps its
    outputs (and node logs) there, and a script's own ./outputs is that folder."""
    start = tmp_path / "azureml-code"  # the command's working directory on an Azure ML node
    start.mkdir()
    env = node_env(tmp_path, AZUREML_RUN_ID="job-1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   NODE_RANK="0", WORLD_SIZE="1")
    result = subprocess.run([sys.executable, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle",
                             str(make_bundle(tmp_path, AZURE_OUTPUTS)), "--workdir", str(tmp_path / "work"),
                             "--script", "train.py", "--nproc-per-node", "1",
                             "--node-contract", "cloudtrain/providers/azure/node.py"], cwd=start, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (start / "outputs" / "model-0.txt").read_text() == "final"
