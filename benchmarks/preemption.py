"""Preemption to training again: a local 2 x 2 job with a >= 250 MB state, preempted, against its own cold start.

    python benchmarks/preemption.py [--jobs 2] [--preemptions 2] [--layers 6] [--store file|s3|gs|az]

Each job (2 nodes x 2 processes, gloo, DDP over Linear(2048, 2048) x LAYERS with Adam: params + 2 moments, about
50 MB a layer) is submitted with ``--max-restarts``; once it trains, ``cloudtrain preempt`` stops it as a spot
interruption would (every node gets SIGTERM, the Checkpointer saves and publishes a final checkpoint, the nodes exit
"preempted") and the local supervisor restarts it, as SageMaker restarts a managed spot job. Timestamps from the
job database (when the supervisor started each node), each node's bootstrap (its restore, in its log) and rank 0 of
the script (each phase) split the time from the restart to the first training step into

    restart   supervisor starts the nodes -> bootstrap, unpack, torchrun, workers start, import, process group
              (the bootstrap's restore excluded)
    restore   the bootstrap's download + verify of the newest checkpoint, and the Checkpointer's load of it
    init      model, optimizer, Checkpointer, the first step

and the same phases of the job's cold start (nothing to restore) are printed beside them. ``stop`` (preempt ->
final checkpoint published -> the restarted nodes start) is printed for information.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from installed import compile_bytecode

REPO = Path(__file__).resolve().parents[1]

SCRIPT = '''
import json, os, sys, time
T = {"script_start": time.time()}
import torch
from torch import nn
from cloudtrain.runtime import Checkpointer, Preempted, init_distributed, shutdown, wrap_model
T["imported"] = time.time()
ctx = init_distributed()
T["process_group"] = time.time()
torch.manual_seed(0)
width, layers = 2048, int(os.environ["BENCH_LAYERS"])
model = wrap_model(nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers))), ctx, "ddp")
opt = torch.optim.Adam(model.parameters(), lr=1e-5)
T["model"] = time.time()
ckpt = Checkpointer(model, opt)
T["checkpointer"] = time.time()
step = ckpt.restore()
T["restored"] = time.time()
x = torch.randn(8, width)
while True:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    step += 1
    if "first_step" not in T:
        T["first_step"] = time.time()
        if ctx.rank == 0:
            print("TIMES " + json.dumps({**T, "step": step}), flush=True)
    time.sleep(0.1)
    try:
        ckpt.step(step)
    except Preempted:
        if ctx.rank == 0:
            print("STOPPED " + json.dumps({"published": time.time(), "step": step}), flush=True)
        raise
'''


def boot_epoch() -> float:
    return time.time() - float(Path("/proc/uptime").read_text().split()[0])


def ticks_to_epoch(ticks: int) -> float:
    return boot_epoch() + ticks / os.sysconf("SC_CLK_TCK")


def cli(home: Path, cwd: Path, *args: str) -> str:
    env = {**os.environ, "CLOUDTRAIN_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"cloudtrain {' '.join(args[:3])} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def job_row(home: Path) -> dict[str, Any]:
    with sqlite3.connect(home / "jobs.db") as db:
        db.row_factory = sqlite3.Row
        row = db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT 1").fetchone()
    return {k: json.loads(row[k]) if k in ("nodes", "plan") else row[k] for k in row.keys()}  # noqa: SIM118 - a Row iterates its values


def tagged(log: Path, tag: str) -> list[dict[str, Any]]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [json.loads(line.split(tag + " ", 1)[1]) for line in text.splitlines() if f"{tag} " in line]


def wait_for(what: Any, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise SystemExit("timed out waiting for the job")


def restore_seconds(log: Path) -> float:
    """The last restore the node's bootstrap logged ('checkpoint: ... (1.2s)')."""
    found = re.findall(r"checkpoint: (?:resuming from step \d+|none yet under \S+) \((\d+\.\d+)s\)",
                       log.read_text(errors="replace"))
    return float(found[-1]) if found else 0.0


def phases(node_start: float, times: dict[str, float], restore: float) -> dict[str, float]:
    return {
        "restart": (times["script_start"] - node_start - restore) + (times["process_group"] - times["script_start"]),
        "restore": restore + (times["restored"] - times["checkpointer"]),
        "restore_node": restore,  # the bootstrap's download + sha256 verify (the slower node)
        "restore_load": times["restored"] - times["checkpointer"],  # the Checkpointer's load of what it brought
        "init": (times["checkpointer"] - times["process_group"]) + (times["first_step"] - times["restored"]),
        "total": times["first_step"] - node_start,
    }


def run_job(tmp: Path, store_uri: str, layers: int,
            preemptions: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    home, proj = tmp / "home", tmp / "proj"
    shutil.rmtree(home, ignore_errors=True)
    proj.mkdir(exist_ok=True)
    (proj / "train_big.py").write_text(SCRIPT)
    submitted = time.time()
    handle = cli(home, proj, "submit", "train_big.py", "--provider", "local", "--nodes", "2", "--procs-per-node", "2",
                 "--checkpoint-uri", store_uri, "--max-restarts", str(preemptions), "--env",
                 f"BENCH_LAYERS={layers}", "--detach").strip()
    job_dir = Path(job_row(home)["job_dir"])
    logs = [job_dir / "node-0.log", job_dir / "node-1.log"]
    cold_times = wait_for(lambda: tagged(logs[0], "TIMES"))[0]
    row = job_row(home)
    cold_start = min(ticks_to_epoch(n["start"]) for n in row["nodes"])
    cold = phases(cold_start, cold_times, max(restore_seconds(log) for log in logs))
    cold["submit_to_first_step"] = cold_times["first_step"] - submitted
    restarts = []
    for attempt in range(1, preemptions + 1):
        time.sleep(1.0)  # a few steps
        preempted = time.time()
        cli(home, proj, "preempt", handle)
        times = wait_for(lambda n=attempt: tagged(logs[0], "TIMES")[n:])[0]
        row = job_row(home)
        restart = min(ticks_to_epoch(n["start"]) for n in row["nodes"])
        published = tagged(logs[0], "STOPPED")[-1]["published"]
        figures = phases(restart, times, max(restore_seconds(log) for log in logs))
        figures.update(stop=restart - preempted, final_checkpoint=published - preempted,
                       restored_step=times["step"] - 1)
        restarts.append(figures)
    cli(home, proj, "cancel", handle)
    wait_for(lambda: job_row(home)["state"] not in ("pending", "running", "stopping"), timeout=120)
    return cold, restarts


def start_store(scheme: str, tmp: Path) -> tuple[str, Any]:
    if scheme == "file":
        return (tmp / "store").as_uri(), None
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("AZURITE_BIN", str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"))
    from tests.emulators import STARTERS, create_bucket

    emulator = STARTERS[scheme](tmp)
    os.environ.update(emulator.env)
    create_bucket(scheme)
    return f"{scheme}://cloudtrain-test/preemption", emulator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--preemptions", type=int, default=2)
    p.add_argument("--layers", type=int, default=6, help="Linear(2048, 2048) layers: ~50 MB of state each")
    p.add_argument("--store", default="file", choices=["file", "s3", "gs", "az"])
    args = p.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    load = os.getloadavg()
    print(f"state {args.layers * 2048 * 2048 * 4 * 3 / 1e6:.0f} MB (params + Adam moments); store {args.store}; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    colds, restarts = [], []
    for j in range(args.jobs):
        tmp = Path(tempfile.mkdtemp(prefix="ct-preempt-"))
        store, emulator = start_store(args.store, tmp)
        try:
            cold, again = run_job(tmp, f"{store}/job-{j}", args.layers, args.preemptions)
        finally:
            if emulator:
                emulator.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        colds.append(cold)
        restarts += again

    def med(rows: list[dict[str, float]], key: str) -> str:
        values = [r[key] for r in rows]
        return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"

    print(f"{'seconds, median (min-max)':30s} {'cold start':>20s} {'restart after preemption':>26s}")
    for key in ("restart", "restore", "restore_node", "restore_load", "init", "total"):
        label = {"restore_node": "  node: download + verify", "restore_load": "  workers: load"}.get(key, key)
        print(f"  {label:28s} {med(colds, key):>20s} {med(restarts, key):>26s}")
    print(f"  {'submit -> first step':28s} {med(colds, 'submit_to_first_step'):>20s}")
    print(f"  {'preempt -> final ckpt':28s} {'':20s} {med(restarts, 'final_checkpoint'):>26s}")
    print(f"  {'preempt -> nodes restarted':28s} {'':20s} {med(restarts, 'stop'):>26s}")
    print(f"restart / cold start (to the first step): "
          f"{statistics.median(r['total'] for r in restarts) / statistics.median(c['total'] for c in colds):.2f}x")


if __name__ == "__main__":
    main()
