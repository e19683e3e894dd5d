"""Every example in examples/ runs through the local provider (real torchrun processes, gloo) and proves its own
result: the values each collective must produce, hand-averaged SGD bitwise equal to DDP, identical replicas, the
no_sync communication count, a resumed FSDP2 run, the torchrun environment detected by Lightning and Accelerate, and
the notebook's plans and local run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

pytestmark = pytest.mark.slow
EXAMPLES = REPO / "examples"
Cli = Callable[..., subprocess.CompletedProcess[str]]


def submit(cli: Cli, script: str, *flags: str, args: tuple[str, ...] = ()) -> str:
    """Run an example in the foreground (exit 0 only if the job succeeded); its output, lines prefixed [nodeN]."""
    result = cli("submit", str(EXAMPLES / script), *flags, *(("--", *args) if args else ()))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


def one(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in output:\n{text[-4000:]}"
    return found


def floats(pattern: str, text: str) -> list[float]:
    return [float(v) for v in re.findall(pattern, text)]


def test_collectives_point_to_point_and_subgroups_across_two_nodes(cli: Cli) -> None:
    out = submit(cli, "collectives.py", "--nodes", "2", "--procs-per-node", "1")
    world = 2
    assert "[node0]" in out and "[node1]" in out  # two torchrun agents: a real multi-node job

    def result(rank: int, name: str) -> list[float]:
        return json.loads(one(rf"rank {rank} {re.escape(name)}: (\[[^\]]*\]) ok=True", out).group(1))

    assert result(world - 1, "send/recv") == [42.0]
    for rank in range(world):
        assert result(rank, "isend/irecv ring") == [float((rank - 1) % world)]  # from the left neighbour
        assert result(rank, "broadcast") == pytest.approx([3.14])
        assert result(rank, "all_reduce") == [float(sum(r + 1 for r in range(world)))]  # 1 + 2 = 3
        assert result(rank, "all_gather") == [float(10 * r) for r in range(world)]
        # rank r keeps chunk r summed over ranks: r * world + 100 * (0 + 1 + ...)
        assert result(rank, "reduce_scatter") == [float(rank * world + 100 * sum(range(world)))]
        members = list(range(rank % 2, world, 2))
        assert result(rank, f"subgroup{members} all_reduce") == [float(sum(r + 1 for r in members))]
        assert f"rank {rank} subgroup rank={members.index(rank)} size={len(members)} not in other group=True" in out
    assert f"collectives: world_size={world} backend=gloo all_ok=True" in out


def test_hand_averaged_sgd_is_bitwise_equal_to_ddp(cli: Cli) -> None:
    out = submit(cli, "sync_sgd.py", "--procs-per-node", "2", args=("--steps", "30"))
    for rank in (0, 1):
        assert f"rank {rank}: hand vs ddp max_abs_diff=0.000e+00 bitwise=True same_as_rank0=True" in out
    summary = one(r"sync_sgd: world_size=2 steps=30 loss_first=([\d.]+) loss_last=([\d.]+) "
                  r"hand_vs_ddp_max_abs_diff=(\S+) hand_vs_ddp_bitwise=True "
                  r"hand_vs_single_process_max_abs_diff=(\S+)", out)
    first, last, ddp_diff, single_diff = map(float, summary.groups())
    assert ddp_diff == 0.0
    assert single_diff < 1e-5  # one process on the global batch: same maths, another summation order
    assert last < first / 10


def test_ddp_sampler_lr_scaling_no_sync_amp_and_rank0_tensorboard(cli: Cli, tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    out = submit(cli, "ddp_playbook.py", "--procs-per-node", "2", args=("--epochs", "3", "--logdir", str(logdir)))
    assert "ddp_playbook: world_size=2 backend=gloo lr=0.02 (base 0.01 x 2) amp=bfloat16 accumulate=2" in out
    losses = floats(r"epoch \d optimizer_steps=\d+ loss=([\d.]+)", out)
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2] and losses[2] < losses[0] / 4
    done = one(r"done: optimizer_steps=(\d+) allreduce_calls=(\d+) micro_batches=(\d+) "
               r"weights_equal_across_ranks=True", out)
    steps, allreduces, micro = map(int, done.groups())
    # 512 samples / 2 ranks / 16 per micro-batch = 16 per epoch; one optimizer step per 2 micro-batches
    assert (micro, steps) == (48, 24)
    assert allreduces == steps  # no_sync: the micro-batches in between communicated nothing (one bucket per sync)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(logdir.glob("events.out.tfevents.*"))
    assert len(events) == 1, "rank 0 alone writes TensorBoard"
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    logged = [e.value for e in acc.Scalars("loss/train")]
    assert logged == pytest.approx(losses, rel=1e-5)
    assert [e.value for e in acc.Scalars("lr")] == pytest.approx([0.02] * 3)


def test_fsdp2_bf16_sharded_checkpoints_and_resume(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "ckpt"
    flags = ("--procs-per-node", "2", "--checkpoint-uri", store.as_uri())
    first = submit(cli, "fsdp2_checkpoint.py", *flags, args=("--epochs", "2"))
    # each rank holds half of every parameter, stored in fp32 and computed in bf16
    assert "block0 weight: full (128, 32) local shard (64, 32) stored float32" in first
    assert "start_step=0 start_epoch=0" in first
    losses = floats(r"epoch \d step \d+ loss ([\d.]+) compute_dtype=bfloat16", first)
    assert len(losses) == 2 and losses[1] < losses[0] / 2
    assert "checkpoint step 32 published" in first
    newest = sorted(p.name for p in store.glob("step-*") if (p / "manifest.json").is_file())
    assert newest[-1] == "step-000000032"
    shards = {p.name for p in (store / "step-000000032").glob("*.distcp")}
    assert len(shards) == 2, f"one shard file per rank: {shards}"

    # the same job with one more epoch resumes from the newest checkpoint instead of starting over
    second = submit(cli, "fsdp2_checkpoint.py", *flags, args=("--epochs", "3"))
    assert "resumed from step 32" in second and "start_step=32 start_epoch=1" in second
    assert not re.search(r"epoch [01] step", second)
    resumed = floats(r"epoch 2 step 48 loss ([\d.]+)", second)
    assert resumed and resumed[0] < losses[1]  # a fresh model would start near losses[0]
    assert "done: steps=48" in second


def test_unmodified_lightning_ddp_script(cli: Cli) -> None:
    out = submit(cli, "lightning_ddp.py", "--procs-per-node", "2", args=("--epochs", "3"))
    # Lightning joined the two processes torchrun started rather than launching its own
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in out
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in out
    assert out.count("Initializing distributed") == 2
    done = one(r"lightning: world_size=2 num_nodes=1 devices=2 cluster_env=TorchElasticEnvironment "
               r"strategy=DDPStrategy backend=gloo batches_per_rank=16 weights_equal_across_ranks=True "
               r"loss_first=([\d.]+) loss_last=([\d.]+)", out)  # 16: Lightning's DistributedSampler halves 32
    first, last = map(float, done.groups())
    assert last < first / 5
    losses = floats(r"epoch \d loss=([\d.]+)", out)
    assert losses == sorted(losses, reverse=True) and len(losses) == 3


def test_unmodified_accelerate_script(cli: Cli) -> None:
    # ACCELERATE_USE_CPU is what `accelerate launch --cpu` sets: without GPUs Accelerate needs it to go multi-process
    out = submit(cli, "accelerate_train.py", "--procs-per-node", "2", "--env", "ACCELERATE_USE_CPU=1",
                 args=("--epochs", "3"))
    assert "accelerate: distributed_type=MULTI_CPU num_processes=2 device=cpu backend=gloo batches_per_process=16" \
        in out
    done = one(r"done: num_processes=2 weights_equal_across_ranks=True loss_first=([\d.]+) loss_last=([\d.]+)", out)
    first, last = map(float, done.groups())
    assert last < first / 5
    losses = floats(r"epoch \d loss=([\d.]+)", out)
    assert losses == sorted(losses, reverse=True) and len(losses) == 3


def python_kernel(root: Path) -> str:
    """A kernel spec for the interpreter running the tests, so the notebook sees this environment's cloudtrain
    (a `python3` spec found elsewhere on the machine might start another Python)."""
    name = "cloudtrain-examples-test"
    spec = root / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "cloudtrain tests", "language": "python"}))
    return name


def test_notebook_plans_every_cloud_and_runs_locally(ct_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    from cloudtrain import list_runs

    jupyter = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))  # searched first for kernel specs
    # the kernel imports this checkout's cloudtrain, as the CLI's jobs do (conftest.cli_env)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(EXAMPLES / "plan_everywhere.ipynb", as_version=4)
    NotebookClient(nb, kernel_name=python_kernel(jupyter), timeout=240,
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()  # raises if a cell fails
    text = "\n".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
                     if o.get("output_type") == "stream")

    # a plan per cloud: 2 nodes x 8 processes (one per A100) on each platform's own machine type
    digests = set()
    for cloud, machine in (("aws", "ml.p4d.24xlarge"), ("azure", "Standard_ND96asr_v4"), ("gcp", "a2-highgpu-8g")):
        digests.add(one(rf"plan {cloud}: nodes=2 procs_per_node=8 package=(sha256:[0-9a-f]{{64}})", text).group(1))
        assert machine in text
    assert len(digests) == 1, "the same package goes to every cloud"
    assert '"EnableManagedSpotTraining": true' in text and '"job_tier": "spot"' in text
    # the same job, run here: one process per node on CPU, every collective checked
    assert "collectives: world_size=2 backend=gloo all_ok=True" in text
    finished = one(r"local run (local://collectives-\S+): succeeded world_size=2", text)
    runs = {str(s.handle): s.state.value for s in list_runs("local")}
    assert runs.get(finished.group(1)) == "succeeded"

    # the estimate of each plan, from the catalog's prices for the machine chosen, x 2 nodes
    from cloudtrain.platforms import catalog

    for cloud, machine in (("aws", "ml.p4d.24xlarge"), ("azure", "Standard_ND96asr_v4"), ("gcp", "a2-highgpu-8g")):
        row = next(m for m in catalog.machines(cloud) if m.instance_type == machine and m.gpus == 8)
        assert row.on_demand is not None
        found = one(rf"estimate {cloud}: 2 x {machine} on-demand \$([0-9.]+)/h spot (\S+).*\(billed as spot\)", text)
        assert float(found.group(1)) == pytest.approx(2 * row.on_demand, abs=0.01)
        assert (found.group(2) == "not") == (row.spot is None)
    # rich outputs: the plan and the finished run as HTML tables, in the notebook's saved outputs
    html = [o["data"]["text/html"] for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
            if "text/html" in o.get("data", {})]
    assert any("Plan for gcp" in h and "a2-highgpu-8g" in h and "on-demand $" in h for h in html)
    # the finished run shows its report (cloudtrain report's page: its state, timeline, goodput)
    assert any(f">{finished.group(1)}<" in h and ">succeeded" in h and "goodput" in h for h in html)
    # outputs: each node's logs, copied to the job's output location; list_runs shows the run
    assert one(r"output: logs/node-0/\S+/stdout\.log", text) and one(r"output: logs/node-1/\S+", text)
    assert f"run: {finished.group(1)} succeeded" in text


def test_the_demo_names_its_job_by_the_handle_it_really_has(ct_home: Path, tmp_path: Path) -> None:
    """`nox -s demo` (examples/preemption_demo.py): preempted once, restarted, resumed. It printed the plan's request
    as a raw dict whose job_id was the plan's example id, not the submitted job's; now it prints the job's settings,
    then names the job by its handle throughout, and ends with what `cloudtrain status` says."""
    from cloudtrain import list_runs

    demo = subprocess.run([sys.executable, str(EXAMPLES / "preemption_demo.py")],
                          env={**cli_env(ct_home), "TMPDIR": str(tmp_path)},  # its store: the test's own
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
    out = demo.stdout
    assert out.startswith("Job demo\n") and "layout       2 node(s) x 2 process(es), ddp" in out, out[:600]
    assert "{'job_id'" not in out and "'world_size'" not in out  # no raw dict
    submitted = re.search(r"^submitted (local://demo-\S+); following its logs", out, re.MULTILINE)
    assert submitted, out[:2000]
    handle = submitted.group(1)
    assert {str(s.handle): s.state.value for s in list_runs("local")} == {handle: "succeeded"}  # the real one
    assert f">>> simulating a spot interruption of {handle} (SIGTERM to every node) <<<" in out
    assert re.search(rf"^{re.escape(handle)}  succeeded\n", out, re.MULTILINE), out[-2000:]  # `status` says
    assert re.search(rf"^{re.escape(handle)}: succeeded after 1 restart\(s\); checkpoints in ", out, re.MULTILINE)
