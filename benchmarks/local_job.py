"""A short local job against bare torchrun running the same script, whole processes, in the same run.

    python benchmarks/local_job.py [--repeat 7]

The script (1 node x 2 processes, gloo, 10 DDP steps of a small model) runs as
  bare:       python -m torch.distributed.run --standalone --nproc-per-node 2 SCRIPT
  cloudtrain: cloudtrain submit SCRIPT --provider local --procs-per-node 2   (foreground: follows the job to its end)
  bare, cloudtrain's exit: bare, with cloudtrain's exit guard in every process (a sitecustomize, as a node has):
              what the job costs beyond torchrun once both end their processes as quickly
rotating the order, each cloudtrain run in a fresh home. Prints the median wall time of each, the ratios (target <=
1.1x bare) and where cloudtrain's time goes, from timestamps each side leaves: the script's first and last line,
and for cloudtrain the supervisor's and each node's start and end (the job database and the node's status file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed import compile_bytecode

REPO = Path(__file__).resolve().parents[1]

SCRIPT = '''
import json, os, sys, time
started = time.time()
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
first_step = None
for step in range(10):
    opt.zero_grad()
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
    first_step = first_step or time.time()
dist.destroy_process_group()
if int(os.environ["RANK"]) == 0:
    print("TIMES " + json.dumps({"script_start": started, "first_step": first_step, "script_end": time.time()}),
          flush=True)
'''


def _times(text: str) -> dict[str, float]:
    for line in text.splitlines():
        if "TIMES " in line:
            return dict(json.loads(line.split("TIMES ", 1)[1]))
    raise SystemExit(f"no TIMES line in the output:\n{text[-3000:]}")


ABORTED_AT_EXIT = [0]  # bare runs whose workers trained, then aborted at exit (cloudtrain/node/exit_guard.py says why)


def bare(script: Path, env: dict[str, str]) -> dict[str, float]:
    while True:
        started = time.time()
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", str(script)], cwd=script.parent, env=env, capture_output=True, text=True)
        ended = time.time()
        if result.returncode == 0:
            return {"start": started, **_times(result.stdout), "exit": ended}
        if "TIMES " not in result.stdout or "terminate called without an active exception" not in result.stderr:
            raise SystemExit(f"bare torchrun failed:\n{result.stderr[-3000:]}")
        ABORTED_AT_EXIT[0] += 1  # gloo's exit race, which cloudtrain's nodes guard against: measured again


GUARD = "from cloudtrain.node.exit_guard import install\ninstall()\n"  # what a node's sitecustomize does at exit


def cloudtrain(script: Path, env: dict[str, str], home: Path) -> dict[str, float]:
    shutil.rmtree(home, ignore_errors=True)
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "cloudtrain", "submit", str(script), "--provider", "local",
                             "--procs-per-node", "2"], cwd=script.parent, env={**env, "CLOUDTRAIN_HOME": str(home)},
                            capture_output=True, text=True)
    ended = time.time()
    if result.returncode != 0:
        raise SystemExit(f"cloudtrain submit failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    times = {"start": started, **_times(result.stdout), "exit": ended}
    with sqlite3.connect(home / "jobs.db") as db:
        created, job_started, job_ended, nodes = db.execute(
            "SELECT created_at, started_at, ended_at, nodes FROM jobs").fetchone()
    node = json.loads(nodes)[0]
    status = json.loads(Path(node["status_file"]).read_text())
    times.update(recorded=created, supervisor_started=job_started, node_start=status["started"],
                 node_end=status["ended"], job_ended=job_ended)
    return times


PHASES_BARE = [("start -> script's first line", "start", "script_start"),
               ("script (first line -> last line)", "script_start", "script_end"),
               ("last line -> exit", "script_end", "exit")]
PHASES_CT = [("CLI start -> job recorded (import, package, stage)", "start", "recorded"),
             ("-> supervisor running, nodes started", "recorded", "supervisor_started"),
             ("-> bootstrap running", "supervisor_started", "node_start"),
             ("-> script's first line (unpack, torchrun, workers)", "node_start", "script_start"),
             ("script (first line -> last line)", "script_start", "script_end"),
             ("-> node ended (torchrun exit, syncs, logs)", "script_end", "node_end"),
             ("-> job ended (supervisor notices)", "node_end", "job_ended"),
             ("-> CLI exit (follower notices, status)", "job_ended", "exit")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    tmp = Path(tempfile.mkdtemp(prefix="ct-localjob-"))
    proj = tmp / "proj"
    proj.mkdir()
    script = proj / "ten_steps.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    guarded = tmp / "guard"
    guarded.mkdir()
    (guarded / "sitecustomize.py").write_text(GUARD)
    env_guarded = {**env, "PYTHONPATH": os.pathsep.join([str(guarded), env["PYTHONPATH"]])}
    runs_bare, runs_ct, runs_guarded = [], [], []
    try:
        for i in range(args.repeat):
            three = [lambda: runs_bare.append(bare(script, env)),
                     lambda: runs_ct.append(cloudtrain(script, env, tmp / "home")),
                     lambda: runs_guarded.append(bare(script, env_guarded))]
            for run in three[i % 3:] + three[:i % 3]:
                run()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    whole_bare, whole_ct, whole_guarded = ([r["exit"] - r["start"] for r in runs]
                                           for runs in (runs_bare, runs_ct, runs_guarded))
    b, c, g = (statistics.median(w) for w in (whole_bare, whole_ct, whole_guarded))
    print(f"bare torchrun            {b:6.2f} s  ({min(whole_bare):.2f}-{max(whole_bare):.2f})")
    print(f"cloudtrain submit        {c:6.2f} s  ({min(whole_ct):.2f}-{max(whole_ct):.2f})   {c / b:5.2f}x  "
          f"(paired {statistics.median(x / y for x, y in zip(whole_ct, whole_bare, strict=True)):.2f}x; "
          "target <= 1.1x)")
    print(f"bare, cloudtrain's exit  {g:6.2f} s  ({min(whole_guarded):.2f}-{max(whole_guarded):.2f})   cloudtrain "
          f"{c / g:5.2f}x this (paired "
          f"{statistics.median(x / y for x, y in zip(whole_ct, whole_guarded, strict=True)):.2f}x)")
    if ABORTED_AT_EXIT[0]:
        print(f"bare torchrun: {ABORTED_AT_EXIT[0]} run(s) trained, then aborted at exit (SIGABRT, gloo's exit race: "
              "a failed job for torchrun); run again, not counted")
    for title, runs, phases in (("bare", runs_bare, PHASES_BARE), ("bare, cloudtrain's exit", runs_guarded,
                                                                    PHASES_BARE), ("cloudtrain", runs_ct, PHASES_CT)):
        print(f"{title}: median seconds per phase")
        for label, a, z in phases:
            print(f"    {label:52s} {statistics.median(r[z] - r[a] for r in runs):6.3f}")


if __name__ == "__main__":
    main()
