"""What checkpoints and cloudtrain's node cost a GPU, as ratios against baselines measured in the same run.

    python benchmarks/gpu_goodput.py                  # on a GPU machine (< 5 min on an H100/H200)
    python benchmarks/gpu_goodput.py --device cpu     # here: the same code paths where they exist, small sizes

(a) Training blocked per ``Checkpointer.save``, against the floor: one copy of the same state into host buffers
    allocated once (pinned on a GPU), and against torch's own ``dcp.async_save`` (no stager, and with
    ``DefaultStager`` where the installed torch has it). Reported as ms per GB too.
(b) Save to published (the manifest in the store, a file:// store on local disk): GB/s, against writing the same
    bytes to that disk (fsync'd).
(c) Restore from the store into the training state (a fresh node: download, verify, DCP load), and from the node's
    own local copy (a restart in place): GB/s, against reading the same files from that disk.
(d) Step time of one script (benchmarks/gpt_steps.py, a GPT-like model on random tokens) under cloudtrain's local
    provider against bare torchrun, in interleaved pairs (median step time of each run). ``--bisect`` adds a third
    run to each pair: torchrun started as a node starts it, with the worker's PYTHONPATH (the bundle's
    sitecustomize), outside the node, to tell a tax inside the worker from one of the node around it.
(e) ``--trainers``: the reference trainers (entrypoints/train_ddp.py, train_fsdp.py --bf16) as local jobs on this
    machine's device, preempted after their first published checkpoint and resumed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpt_steps import GPT  # noqa: E402

RESULTS: dict[str, Any] = {}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpt_of(gb: float, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A GPT-like model whose fp32 parameters and AdamW moments take about ``gb`` GB, with the moments
    materialised (one step)."""
    width = 2048 if gb >= 1 else 512
    block = 12 * width * width
    embed = 2 * 8192 * width
    depth = max(1, round((gb * 1e9 / 12 - embed) / block))
    model = GPT(8192, width, depth, 16 if width >= 1024 else 8, 128).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(8192, (2, 129), device=device)
    torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync(device)
    return model, opt


def state_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = list(model.state_dict().values())
    for s in opt.state.values():
        found += [v for v in s.values() if torch.is_tensor(v) and v.numel() > 1]
    return found


def copy_floor(tensors: list[torch.Tensor], device: torch.device, repeat: int) -> float:
    """One copy of every state tensor into host buffers allocated once (pinned where there is a GPU)."""
    pin = device.type == "cuda"
    buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in tensors]
    times = []
    for _ in range(repeat + 1):
        sync(device)
        start = time.perf_counter()
        for b, t in zip(buffers, tensors, strict=True):
            b.copy_(t, non_blocking=pin)
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def torch_async_save(model: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path, group: Any,
                     stager: bool) -> float | str:
    """Training blocked by torch's own ``dcp.async_save`` (no stager, or DefaultStager with pinned, shared,
    async staging), the second of two saves (the first warms up); or why it could not run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    kwargs: dict[str, Any] = {}
    if stager:
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        except ImportError as exc:
            return f"not in this torch ({exc})"
    times = []
    try:
        if stager:
            gpu = torch.cuda.is_available()  # pinned memory and non-blocking copies need an accelerator
            kwargs["async_stager"] = DefaultStager(StagingOptions(gpu, True, True, gpu))
        for i in range(2):
            model_sd, optim_sd = get_state_dict(model, opt)
            start = time.perf_counter()
            result = dcp.async_save({"model": model_sd, "optim": optim_sd},
                                    storage_writer=dcp.FileSystemWriter(str(folder / f"{stager}-{i}")),
                                    process_group=group, **kwargs)
            staged = getattr(result, "staging_completion", None)
            if staged is not None:
                staged.result()  # training may change the tensors from here on
            times.append(time.perf_counter() - start)
            (getattr(result, "upload_completion", None) or result).result()
            shutil.rmtree(folder / f"{stager}-{i}", ignore_errors=True)  # GBs each
    except Exception as exc:
        return f"{type(exc).__name__}: {exc} | {traceback.format_exc().splitlines()[-3].strip()}"
    finally:
        if stager and "async_stager" in kwargs:
            with contextlib.suppress(Exception):
                kwargs["async_stager"].close()
    return times[-1]


def disk_write(folder: Path, nbytes: int, files: int = 1) -> float:
    """Seconds to write ``nbytes`` to this disk as ``files`` files at once, each fsync'd (the disk's durable write
    speed; a virtual or NVMe disk may be faster with several streams than with one)."""
    chunk = os.urandom(1 << 20) * 64
    folder.mkdir(parents=True, exist_ok=True)

    def one(i: int) -> None:
        with open(folder / f"anchor-{i}.bin", "wb") as f:
            left = nbytes // files
            while left > 0:
                left -= f.write(chunk[: min(left, len(chunk))])
            f.flush()
            os.fsync(f.fileno())

    start = time.perf_counter()
    with ThreadPoolExecutor(files) as pool:
        list(pool.map(one, range(files)))
    took = time.perf_counter() - start
    shutil.rmtree(folder)
    return took


def disk_read(folder: Path, threads: int = 1) -> tuple[float, int]:
    """Seconds to read every file under ``folder`` (``threads`` files at once), and the bytes read."""
    def one(path: Path) -> int:
        total = 0
        with open(path, "rb") as f:
            while chunk := f.read(64 << 20):
                total += len(chunk)
        return total

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(one, [p for p in folder.rglob("*") if p.is_file()]))
    return time.perf_counter() - start, total


def checkpoints(args: argparse.Namespace, device: torch.device, tmp: Path) -> None:
    from cloudtrain.checkpoint.store import step_dir
    from cloudtrain.runtime.checkpointer import Checkpointer

    model, opt = gpt_of(args.gb, device)
    tensors = state_tensors(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    gb = nbytes / 1e9
    floor = copy_floor(tensors, device, args.repeat)
    store = tmp / "store"
    ckpt = Checkpointer(model, opt, uri=store.as_uri(), local_dir=tmp / "node")
    published, ready = [], []
    for step in range(1, args.repeat + 2):
        start, wall = time.perf_counter(), time.time()
        ckpt.save(step)
        ckpt.wait()
        ready.append(time.perf_counter() - start)  # the publish, then retention (the step before last removed)
        # published: the manifest written, the moment the checkpoint exists (its "created" is stamped just before)
        manifest = json.loads((store / step_dir(step) / "manifest.json").read_text())
        published.append(float(manifest["created"]) - wall)
    blocked_first, blocked = ckpt.blocked_seconds[0], statistics.median(ckpt.blocked_seconds[1:])
    publish, until_ready = statistics.median(published[1:]), statistics.median(ready[1:])
    ckpt.close(save=False)
    group = dist.new_group(backend="gloo")
    plain = torch_async_save(model, opt, tmp / "dcp", group, stager=False)
    staged = torch_async_save(model, opt, tmp / "dcp", group, stager=True)
    shutil.rmtree(tmp / "dcp", ignore_errors=True)
    from cloudtrain.checkpoint.saves import write_threads

    files = write_threads()  # what a rank writes and reads at once
    write = disk_write(tmp / "disk-anchor", nbytes)
    write_many = disk_write(tmp / "disk-anchor", nbytes, files)
    del model, opt, tensors
    if device.type == "cuda":
        torch.cuda.empty_cache()

    model, opt = gpt_of(args.gb, device)
    fresh = Checkpointer(model, opt, uri=store.as_uri(), local_dir=tmp / "fresh-node")
    sync(device)
    start = time.perf_counter()
    step = fresh.restore()
    sync(device)
    restore_fresh = time.perf_counter() - start
    fresh.close(save=False)
    in_place = Checkpointer(model, opt, uri=store.as_uri(), local_dir=tmp / "fresh-node")
    start = time.perf_counter()
    in_place.restore()
    sync(device)
    restore_local = time.perf_counter() - start
    in_place.close(save=False)
    read, read_bytes = disk_read(store)
    read_many, _ = disk_read(store, files)
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()

    ms_gb = lambda s: s * 1000 / gb  # noqa: E731
    print(f"state: {gb:.2f} GB (fp32 parameters + AdamW moments) on {device}; {args.repeat + 1} saves, restored "
          f"step {step}")
    print("(a) training blocked per save")
    print(f"    copy floor ({'pinned' if device.type == 'cuda' else 'pre-allocated'} host buffers)  {floor:7.3f} s "
          f"{ms_gb(floor):7.1f} ms/GB")
    print(f"    Checkpointer.save                 {blocked:7.3f} s {ms_gb(blocked):7.1f} ms/GB  "
          f"{blocked / floor:6.2f}x floor (target <= 2x); first save {blocked_first:.3f} s")
    for name, value in (("dcp.async_save, no stager", plain), ("dcp.async_save, DefaultStager", staged)):
        shown = f"{value:7.3f} s {ms_gb(value):7.1f} ms/GB  {value / floor:6.2f}x floor" \
            if isinstance(value, float) else value
        print(f"    {name:33} {shown}")
    print("(b) save to published (file:// store on local disk)")
    best_write, best_read = min(write, write_many), min(read, read_many)
    print(f"    disk write, fsync'd, 1 file       {nbytes / write / 1e9:7.2f} GB/s")
    print(f"    the same, {files} files at once       {nbytes / write_many / 1e9:7.2f} GB/s")
    print(f"    Checkpointer save -> manifest     {gb / publish:7.2f} GB/s  {best_write / publish:6.2f}x the disk's "
          "best (target >= 2 GB/s)")
    print(f"    the same, until the next may start {gb / until_ready:6.2f} GB/s  (with retention: the one before last "
          "removed)")
    print("(c) restore into the training state")
    print(f"    disk read of the store's files    {read_bytes / read / 1e9:7.2f} GB/s (1 at a time), "
          f"{read_bytes / read_many / 1e9:.2f} GB/s ({files} at once)")
    print(f"    from the store (a fresh node)     {gb / restore_fresh:7.2f} GB/s  {best_read / restore_fresh:6.2f}x "
          "the disk's best read (target >= 2 GB/s)")
    print(f"    from its local copy (in place)    {gb / restore_local:7.2f} GB/s  {best_read / restore_local:6.2f}x "
          "the disk's best read")
    RESULTS["checkpoint"] = {"gb": gb, "floor_s": floor, "blocked_s": blocked, "blocked_first_s": blocked_first,
                             "dcp_async_s": plain, "dcp_default_stager_s": staged, "disk_write_gbps": nbytes / write
                             / 1e9, "disk_write_parallel_gbps": nbytes / write_many / 1e9, "files_per_rank": files,
                             "publish_gbps": gb / publish, "ready_gbps": gb / until_ready,
                             "disk_read_gbps": read_bytes / read / 1e9,
                             "disk_read_parallel_gbps": read_bytes / read_many / 1e9,
                             "restore_store_gbps": gb / restore_fresh, "restore_local_gbps": gb / restore_local}


def median_step(out: Path) -> tuple[float, dict[str, Any]]:
    data = json.loads(out.read_text())
    return statistics.median(data["step_seconds"]), data


def step_time(args: argparse.Namespace, device: torch.device, tmp: Path) -> None:
    from cloudtrain import Job

    source = tmp / "steps-src"
    source.mkdir()
    shutil.copy(REPO / "benchmarks" / "gpt_steps.py", source)
    small = [] if device.type == "cuda" else ["--width", "128", "--depth", "2", "--context", "64", "--vocab", "1024"]
    env = {**os.environ, **({"CLOUDTRAIN_FORCE_CPU": "1"} if device.type == "cpu" else {})}
    medians: dict[str, list[float]] = {"bare": [], "cloudtrain": [], "node torchrun": []}
    rows, pythonpath = [], None
    kinds = ["bare", "cloudtrain", *(["node torchrun"] if args.bisect else [])]
    for pair in range(args.pairs):
        shift = pair % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            out = tmp / f"steps-{kind.replace(' ', '-')}-{pair}.json"
            script_args = ["--steps", str(args.steps), "--out", str(out), *small]
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
            if kind == "cloudtrain":
                job = Job(name="steps", source_dir=str(source), script="gpt_steps.py", args=script_args,
                          env={"CLOUDTRAIN_FORCE_CPU": "1"} if device.type == "cpu" else {})
                state = job.submit("local").wait()
                if state.state.value != "succeeded":
                    raise SystemExit(f"the cloudtrain run ended {state.state.value}: {state.message}")
            else:
                run_env = env
                if kind == "node torchrun":  # torchrun as a node starts it, with the worker's PYTHONPATH (the
                    # bundle's sitecustomize), without the node around it: which half a step tax is in. The first
                    # pair runs bare, cloudtrain, then this, so the cloudtrain run has named PYTHONPATH by now
                    run_env = {**env, "PYTHONPATH": pythonpath or ""}
                    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                                "1", "--max-restarts", "0", "--redirects", "3", "--log-dir", str(tmp / "node-logs"),
                                "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                                str(29400 + pair)]
                subprocess.run([*launcher, str(source / "gpt_steps.py"), *script_args], check=True, env=run_env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            median, data = median_step(out)
            if kind == "cloudtrain":
                pythonpath = data.get("pythonpath")
            medians[kind].append(median)
            rows.append(f"{kind}: {median * 1000:.2f} ms (threads {data['threads']}, OMP {data['omp']})")
    bare, ours = medians["bare"], medians["cloudtrain"]
    ratio = statistics.median(ours) / statistics.median(bare)
    seen = {kind: median_step(tmp / f"steps-{kind}-0.json")[1] for kind in ("bare", "cloudtrain")}
    only = {kind: sorted(set(seen[kind]["env"]) - set(seen[other]["env"]))
            for kind, other in (("bare", "cloudtrain"), ("cloudtrain", "bare"))}
    print(f"(d) step time, {args.steps} steps x {args.pairs} interleaved pairs ({device})")
    for row in rows:
        print(f"    {row}")
    print(f"    cloudtrain / bare torchrun        {ratio:7.3f}x  (target <= 1.01x); per pair "
          + ", ".join(f"{o / b:.3f}x" for o, b in zip(ours, bare, strict=True)))
    if medians["node torchrun"]:
        node = statistics.median(medians["node torchrun"]) / statistics.median(bare)
        print(f"    node torchrun / bare torchrun     {node:7.3f}x  (the worker as a node starts it, without the node: "
              "the rest of a tax is the node's)")
    for kind in ("bare", "cloudtrain"):  # what differs for the worker, to look for a tax (names only: no values)
        print(f"    {kind} worker only: {', '.join(only[kind]) or 'nothing'}; {seen[kind]['modules']} modules, "
              f"{seen[kind]['affinity']} CPUs")
    RESULTS["steps"] = {"bare_ms": [b * 1000 for b in bare], "cloudtrain_ms": [o * 1000 for o in ours],
                        "node_torchrun_ms": [n * 1000 for n in medians["node torchrun"]], "ratio": ratio}


def node_cpu(device: torch.device, tmp: Path, seconds: float = 10.0) -> None:
    """CPU seconds per second that cloudtrain's own processes on a node (the local supervisor, the bootstrap with its
    log echo, watchdog and checkpoint-folder watcher) take while the script trains; torchrun's agent for reference
    (bare torchrun runs it too). The script sleeps, so whatever CPU is counted is cloudtrain's."""
    from cloudtrain import Job

    source = tmp / "idle-src"
    source.mkdir()
    (source / "idle.py").write_text("import time\ntime.sleep(float(__import__('sys').argv[1]))\n")
    job = Job(name="idle", source_dir=str(source), script="idle.py", args=[str(seconds + 8)],
              checkpoint={"uri": (tmp / "idle-store").as_uri(), "dir": "ckpt"},
              env={"CLOUDTRAIN_FORCE_CPU": "1"} if device.type == "cpu" else {})
    run = job.submit("local")
    time.sleep(5)  # past the start-up

    def sample() -> dict[str, tuple[str, int]]:
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if run.handle.job_id not in cmd and "idle.py" not in cmd:
                    continue
                kind = ("worker" if cmd.rstrip().endswith(("idle.py", str(seconds + 8))) and "bootstrap" not in cmd
                        and "torch.distributed.run" not in cmd else "supervisor" if "supervisor" in cmd else
                        "torchrun agent" if "torch.distributed.run" in cmd else "bootstrap")
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                found[pid] = (kind, int(fields[11]) + int(fields[12]))
        return found

    before = sample()
    time.sleep(seconds)
    after = sample()
    run.wait()
    per: dict[str, float] = {}
    for pid, (kind, ticks) in after.items():
        if pid in before:
            per[kind] = per.get(kind, 0.0) + (ticks - before[pid][1]) / os.sysconf("SC_CLK_TCK") / seconds
    ours = sum(v for k, v in per.items() if k in ("supervisor", "bootstrap"))
    print(f"    cloudtrain's own processes        {ours:7.4f} CPU-s per s of training (" +
          ", ".join(f"{k} {v:.4f}" for k, v in sorted(per.items())) + ")")
    RESULTS.setdefault("steps", {})["node_cpu_per_s"] = per


def trainers(device: torch.device, tmp: Path) -> None:
    """Each reference trainer as a local job on this machine's device, preempted after its first published
    checkpoint. The phases from the preemption to training again are timed by when their log lines arrive here
    (``logs -f`` reads every ~0.5 s): restart (the node up again), restore (the node's own figure), init (to the
    trainer's ``training:`` line), first step (the Checkpointer's ``training again`` line)."""
    from cloudtrain import Job
    from cloudtrain.providers import get_provider

    cases = {"ddp": ("train_ddp.py", ["--epochs", "2", "--samples", "4096", "--checkpoint-every", "20"]),
             "fsdp-bf16": ("train_fsdp.py", ["--epochs", "2", "--samples", "4096", "--checkpoint-every", "20",
                                             "--bf16", "--width", "256"])}
    env = {"CLOUDTRAIN_FORCE_CPU": "1"} if device.type == "cpu" else {}
    print(f"(e) reference trainers, preempted after their first published checkpoint ({device})")
    for name, (script, extra) in cases.items():
        store = tmp / f"trainer-{name}"
        job = Job(name=f"ref-{name}", source_dir=str(REPO / "entrypoints"), script=script, max_restarts=1, env=env,
                  checkpoint={"uri": (store / "ckpt").as_uri()}, output_uri=(store / "out").as_uri(),
                  args=[*extra, "--step-sleep", "0.02"])
        run = job.submit("local")
        preempted_at, said, marks = None, [], {}
        for line in run.logs(follow=True):
            now = time.monotonic()
            if any(word in line for word in ("training:", "training again", "resumed from", "resuming from",
                                             "done:", "Traceback", "Error")):
                said.append(line.strip())
            if preempted_at is None and "published" in line:
                get_provider("local").preempt(run.handle)
                preempted_at = now
            elif preempted_at is not None:
                for mark, word in (("up", " on local: "), ("restored", "checkpoint: resuming from"),
                                   ("init", "training:"), ("stepping", "training again")):
                    if word in line and mark not in marks:
                        marks[mark] = now
        status = run.wait()
        phases = {}
        if preempted_at is not None and len(marks) == 4:
            phases = {"restart": marks["up"] - preempted_at, "restore": marks["restored"] - marks["up"],
                      "init": marks["init"] - marks["restored"], "first step": marks["stepping"] - marks["init"]}
        print(f"    {name}: {status.state.value}, restarts {status.restarts}, preempted {preempted_at is not None}; "
              + (", ".join(f"{k} {v:.1f}s" for k, v in phases.items()) if phases else f"phases not seen {marks}"))
        for line in said[:8]:
            print(f"      {line[:160]}")
        RESULTS.setdefault("trainers", {})[name] = {"state": status.state.value, "restarts": status.restarts,
                                                    "phases": phases, "lines": said[:8]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--gb", type=float, default=None, help="checkpoint state size (default 4 on a GPU, 0.2 on CPU)")
    p.add_argument("--repeat", type=int, default=3, help="saves measured (after one warm-up)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], choices=["checkpoint", "steps"])
    p.add_argument("--trainers", action="store_true")
    p.add_argument("--bisect", action="store_true", help="(d) also runs the script under torchrun as a node starts "
                   "it, with the worker's PYTHONPATH, outside the node")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    device = torch.device(args.device)
    args.gb = args.gb if args.gb is not None else (4.0 if device.type == "cuda" else 0.2)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}, {os.cpu_count()} CPUs")
    RESULTS["machine"] = {"torch": torch.__version__, "device": name, "cpus": os.cpu_count()}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300), RANK="0",
                      WORLD_SIZE="1")
    home = tempfile.mkdtemp(prefix="gpu-goodput-home-")
    os.environ.setdefault("CLOUDTRAIN_HOME", home)  # the local jobs' records and store
    dist.init_process_group("gloo")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-goodput-"))
    try:
        if "checkpoint" not in args.skip:
            checkpoints(args, device, tmp)
        if "steps" not in args.skip:
            step_time(args, device, tmp)
            node_cpu(device, tmp)
        if args.trainers:
            trainers(device, tmp)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)  # several checkpoints of the state: GBs
        shutil.rmtree(home, ignore_errors=True)
        if args.json:
            Path(args.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
