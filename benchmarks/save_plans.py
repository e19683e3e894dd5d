"""DCP save planning: a save whose layout is unchanged, with the Checkpointer's cached save plans against planning it
again, in the same run.

    python benchmarks/save_plans.py [--ranks 4] [--tensors 2400] [--repeat 9]

Each rank holds ``--tensors`` small tensors (the items of a model with many parameters and their AdamW moments; small,
so the writing is a minor part and the planning shows) and saves them with DCP as the Checkpointer's background
thread does (``dcp_files.writer``, ``dcp_files.SavePlanner``, gloo), alternating the two planners, one warm-up save
each. Prints the median time per save and per planning (the local plan, the gather to rank 0, the global plan and
the scatter back) of each, and their ratio. Where the installed torch has no plan cache, both rows are the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RANK = r'''
import json, os, sys, time
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import state_dict_saver
from cloudtrain.runtime import dcp_files

tensors, repeat, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
group = dist.new_group(backend="gloo")  # as the Checkpointer's save group
rank = dist.get_rank()
torch.manual_seed(rank)
state = {"model": {f"layer{i}.weight": torch.randn(64) for i in range(tensors // 3)},
         "optim": {f"state.layer{i}.{moment}": torch.randn(64) for i in range(tensors // 3)
                   for moment in ("exp_avg", "exp_avg_sq")}}
planning = []
real_reduce_scatter = state_dict_saver._DistWrapper.reduce_scatter
def reduce_scatter(self, step, map_fun, reduce_fun):  # DCP's planning collective: local plans in, final plans out
    started = time.perf_counter()
    try:
        return real_reduce_scatter(self, step, map_fun, reduce_fun)
    finally:
        if step == "plan":
            planning.append(time.perf_counter() - started)
state_dict_saver._DistWrapper.reduce_scatter = reduce_scatter
times = {"planned every save": [], "cached plans": []}
for i in range(repeat + 1):
    for kind in (times if i % 2 == 0 else reversed(list(times))):
        planner = dcp_files.SavePlanner("bench" if kind == "cached plans" else None)
        started = time.perf_counter()
        dcp.save(state, storage_writer=dcp_files.writer(f"{folder}/{kind}-{i}", 2), planner=planner,
                 process_group=group)
        took = time.perf_counter() - started
        if i:  # the first of each is a warm-up (and the cache's first plan)
            times[kind].append((took, planning[-1]))
if rank == 0:
    print(json.dumps({"times": times, "caching": dcp_files.PLAN_CACHING}))
dist.destroy_process_group()
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tensors", type=int, default=2400, help="items per rank (a third parameters, the rest moments)")
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK)
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                              str(args.ranks), str(script), str(args.tensors), str(args.repeat), tmp],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        if run.returncode != 0:
            print(run.stdout[-2000:] + run.stderr[-4000:], file=sys.stderr)
            return 1
    got = json.loads(run.stdout.strip().splitlines()[-1])
    medians = {kind: (statistics.median(t for t, _ in rows), statistics.median(p for _, p in rows))
               for kind, rows in got["times"].items()}
    print(f"DCP save of {args.tensors} small tensors per rank, {args.ranks} ranks (gloo), {args.repeat} saves each, "
          f"median (torch's plan cache {'used' if got['caching'] else 'absent: both rows plan every save'})")
    for kind, (save, plan) in medians.items():
        print(f"    {kind:<20} save {save * 1000:8.1f} ms   planning {plan * 1000:8.1f} ms")
    (every_save, every_plan), (cached_save, cached_plan) = medians["planned every save"], medians["cached plans"]
    print(f"    cached / planned every save: save {cached_save / every_save:.2f}x, planning "
          f"{cached_plan / every_plan:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
