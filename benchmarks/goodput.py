"""Goodput of a spot job over a synthetic day: fallback across providers/regions against staying put.

    python benchmarks/goodput.py [--seeds 20] [--work 16] [--nodes 2] [--gpus A100:8] [--max-restarts 3]

A seeded 24-hour trace per leg (aws us-east-1, aws us-west-2, gcp us-central1, azure eastus) holds spot reclaims
(Poisson, a rate per leg) and capacity outages (Poisson starts, exponential lengths; a reclaim inside an outage is
"capacity gone" as the platform words it, e.g. SageMaker's InsufficientCapacityError). A job needing ``--work``
hours of training is replayed against cloudtrain's real decision code, with simulated time (a fake clock: nothing
sleeps): ``recovery.drive`` (status polling with backoff, ``advance``: restart or move, ``max_restarts`` per leg,
``max_recovery``), ``Provider.capacity_error`` (the base class's, on each fake provider's declared
``capacity_patterns``) and ``fallback.try_legs`` (a submit refused for capacity moves on). Fake providers answer
from the trace: provisioning takes 6 minutes, a restore 3, a cross-cloud checkpoint copy 10; a reclaim loses the
progress since the last checkpoint (every 10 minutes of training, or checkpoint.interval auto's choice), and each
checkpoint blocks training for ``--checkpoint-cost`` seconds.

Reported per policy (mean over seeds): goodput = useful training time / wall time (to the end of the job; a job
that did not finish, its restarts spent, counts the whole day), cost (node-hours x list price from
cloudtrain/platforms/catalog.py: spot where published, else on-demand) against on-demand for the same useful
work, legs used,
resubmissions, and whether the job finished; then ratios of the fallback policy against the baseline (no fallback:
the first leg only), measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DAY = 24 * 3600.0
PROVISION, RESTORE, COPY, CKPT = 360.0, 180.0, 600.0, 600.0
CKPT_COST = 30.0  # seconds training is blocked per checkpoint (--checkpoint-cost)
# leg -> (reclaims per hour, capacity outages per hour, mean outage hours)
LEGS = {("aws", "us-east-1"): (0.35, 0.10, 3.0), ("aws", "us-west-2"): (0.25, 0.06, 2.0),
        ("gcp", "us-central1"): (0.30, 0.08, 2.0), ("azure", "eastus"): (0.20, 0.05, 1.5)}


def price(provider: str, gpus: str, nodes: int) -> tuple[float, float]:
    """(spot, on-demand) USD per hour for the job's nodes from cloudtrain's catalog; spot falls back to on-demand
    where the platform publishes none (SageMaker, Azure ML): the one place cost is computed."""
    from cloudtrain.platforms import catalog

    model, count = catalog.parse_accelerator(gpus)
    machine = catalog.lookup(provider, model, count)
    if machine is None or machine.on_demand is None:
        raise SystemExit(f"no {gpus} price for {provider} in the catalog")
    return (machine.spot or machine.on_demand) * nodes, machine.on_demand * nodes


@dataclass
class Trace:
    reclaims: list[float]
    outages: list[tuple[float, float]]

    def out(self, t: float) -> float | None:
        """When the outage covering ``t`` ends, or None."""
        return next((end for start, end in self.outages if start <= t < end), None)


def make_trace(rng: random.Random, reclaim_rate: float, outage_rate: float, outage_hours: float) -> Trace:
    def poisson(rate: float) -> list[float]:
        times: list[float] = []
        t = 0.0
        while True:
            t += rng.expovariate(rate / 3600)
            if t >= DAY * 2:
                return times
            times.append(t)
    outages = [(s, s + rng.expovariate(1 / (outage_hours * 3600))) for s in poisson(outage_rate)]
    return Trace(poisson(reclaim_rate), outages)


@dataclass
class World:
    """The day as the fake platforms see it, and the job's progress (its newest checkpoint)."""

    traces: dict[str, Trace]
    work: float
    clock: Any
    saved: float = 0.0  # useful seconds in the newest checkpoint
    useful: float = 0.0
    cost: float = 0.0
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)
    interval: float = CKPT  # seconds of training between checkpoints
    blocked: float = CKPT_COST  # seconds each checkpoint blocks training

    def wall_for(self, training: float) -> float:
        """Wall seconds that hold ``training`` seconds of steps, with a checkpoint after every interval of them."""
        return training + self.blocked * math.floor(training / self.interval)

    def kept(self, ran: float) -> float:
        """Training seconds in the newest checkpoint after ``ran`` wall seconds: whole cycles only."""
        return self.interval * math.floor(ran / (self.interval + self.blocked))


def fake_providers(world: World) -> dict[str, Any]:
    from cloudtrain.errors import CapacityError
    from cloudtrain.handles import JobHandle
    from cloudtrain.job_types import JobState, JobStatus
    from cloudtrain.providers.base import Provider

    class Fake(Provider):
        capacity_patterns = (r"InsufficientCapacityError|capacity is gone",)

        def __init__(self, name: str) -> None:
            self.fake_name = name

        def start(self, leg: str, job_id: str, delay: float = 0.0) -> JobHandle:
            now = world.clock.time()
            if world.traces[leg].out(now) is not None:
                raise CapacityError(f"{leg}: InsufficientCapacityError: no spot capacity")
            handle = JobHandle(self.fake_name, job_id, ())
            world.jobs[str(handle)] = {"leg": leg, "submitted": now, "begins": now + delay + PROVISION,
                                       "ended": None, "state": JobState.PENDING, "message": "", "billed": now}
            return handle

        def describe(self, handle: JobHandle) -> JobStatus:
            job = world.jobs[str(handle)]
            self._advance(job)
            return JobStatus(handle=handle, name=handle.job_id, state=job["state"], message=job["message"])

        def _advance(self, job: dict[str, Any]) -> None:
            now = world.clock.time()
            if job["state"].terminal:
                return
            trace = world.traces[job["leg"]]
            blocked = trace.out(job["begins"])  # capacity out when it should start: it waits
            if blocked is not None:
                job["begins"] = blocked + PROVISION
            if now < job["begins"]:
                return
            job["state"] = JobState.RUNNING
            start = job["begins"] + RESTORE
            reclaim = next((r for r in trace.reclaims if r > job["begins"]), DAY * 2)
            done_at = start + world.wall_for(world.work - world.saved)
            end = min(reclaim, done_at)
            if now < end:
                return
            self._bill(job, end)
            ran = max(0.0, end - start)
            if end == done_at:
                world.useful += world.work - world.saved
                world.saved = world.work
                job["state"], job["message"] = JobState.SUCCEEDED, "completed"
                return
            kept = world.kept(ran)  # progress since the last checkpoint is lost
            world.saved += kept
            world.useful += kept
            gone = trace.out(end + 1) is not None
            job["state"] = JobState.PREEMPTED
            job["message"] = "spot reclaimed; capacity is gone in the region" if gone else "spot reclaimed"

        def _bill(self, job: dict[str, Any], until: float) -> None:
            world.cost += max(0.0, until - job["begins"] + PROVISION) / 3600 * world.prices[job["leg"]]

        def resubmit(self, handle: JobHandle, new_name: str) -> JobHandle:
            found = JobHandle(self.fake_name, new_name, ())
            if str(found) in world.jobs:
                return found
            world.jobs[str(found)] = {**world.jobs[str(handle)], "submitted": world.clock.time(),
                                      "begins": world.clock.time() + PROVISION, "state": JobState.PENDING,
                                      "message": ""}
            return found

        def _plan(self, *a: Any) -> Any: raise NotImplementedError
        def _submit(self, *a: Any) -> Any: raise NotImplementedError
        def _describe(self, *a: Any) -> Any: raise NotImplementedError
        def _logs(self, *a: Any) -> Any: raise NotImplementedError
        def _cancel(self, *a: Any) -> Any: raise NotImplementedError
        def _list(self, *a: Any) -> Any: raise NotImplementedError

    return {name: type(f"Fake{name}", (Fake,), {"name": name})(name) for name in ("aws", "gcp", "azure")}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)


def replay(seed: int, legs: list[tuple[str, str]], work_h: float, gpus: str, nodes: int,
           max_restarts: int, interval: float = CKPT, blocked: float = CKPT_COST) -> dict[str, float]:
    from cloudtrain.backoff import Backoff
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.jobs.fallback import Leg, Refused, try_legs
    from cloudtrain.jobs.recovery import RecoveryState, drive, save

    rng = random.Random(seed)
    traces = {f"{p} {r}": make_trace(rng, *LEGS[(p, r)]) for p, r in LEGS}  # same day for every policy
    clock = FakeClock()
    world = World(traces, work_h * 3600, clock, prices={f"{p} {r}": price(p, gpus, nodes)[0] for p, r in LEGS},
                  interval=interval, blocked=blocked)
    fakes = fake_providers(world)
    order = [Leg(p, r) for p, r in legs]
    count = [0]

    def attempt(leg: Leg, delay: float = 0.0) -> tuple[Any, Any]:
        count[0] += 1
        try:
            return fakes[leg.provider], fakes[leg.provider].start(leg.label(), f"job{count[0]}", delay)
        except CloudtrainError as exc:
            raise Refused(fakes[leg.provider], exc) from exc

    def mover(legs_data: Any, leg: int, _spec: Any, current: Any, status: Any, why: str, log: Any) -> Any:
        def copied_first(target: Leg) -> tuple[Any, Any]:  # the checkpoint is copied store to store first
            return attempt(target, COPY)

        _p, handle, index, _r = try_legs(order, copied_first, leg + 1, log)
        return handle, index

    quiet = lambda _m: None  # noqa: E731
    while True:  # the first submit waits for a leg with capacity (as a user retrying would)
        try:
            provider, handle, first, _refused = try_legs(order, attempt, 0, quiet)
            break
        except CloudtrainError:
            clock.sleep(600)
    state = RecoveryState(root=str(handle), max_restarts=max_restarts, chain=[str(handle)], max_recovery=DAY,
                          legs=[{"provider": leg.provider, "region": leg.region} for leg in order], leg=first,
                          history=[{"handle": str(handle), "why": "submitted", "leg": first}])
    save(state)
    with contextlib.suppress(CloudtrainError):  # budget spent, or no leg left with capacity
        drive(provider, state, poll=60.0, clock=clock, log=quiet, backoff=Backoff(60, 600, rng=rng), mover=mover,
              resolve=lambda name: fakes[name])
    wall = clock.time() if world.saved >= world.work else DAY  # unfinished: the day is what it cost the user
    on_demand = price(order[0].provider, gpus, nodes)[1] * world.useful / 3600
    return {"goodput": world.useful / max(wall, 1.0), "cost": world.cost, "cost_vs_on_demand":
            world.cost / on_demand if on_demand else float("nan"), "legs": len({h.get("leg") for h in state.history}),
            "resubmissions": state.restarts, "finished": float(world.saved >= world.work), "hours": wall / 3600}


def main() -> int:
    from cloudtrain.plan.checkpoint_interval import auto_interval

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--work", type=float, default=16.0, help="hours of training the job needs")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus", default="A100:8")
    parser.add_argument("--max-restarts", type=int, default=3, help="per leg")
    parser.add_argument("--checkpoint-cost", type=float, default=CKPT_COST, help="seconds blocked per checkpoint")
    args = parser.parse_args()
    os.environ["CLOUDTRAIN_HOME"] = tempfile.mkdtemp(prefix="goodput-")  # recovery state of the replays
    everything = list(LEGS)
    # checkpoint.interval auto, as a job that ran before chooses it: its blocked time and its interruptions measured
    # (the first leg's reclaim rate), and as a first run does (cloudtrain's assumptions)
    measured = auto_interval(spot=True, nodes=args.nodes, max_runtime=int(DAY), cost=args.checkpoint_cost,
                             between=3600 / LEGS[everything[0]][0]).seconds
    assumed = auto_interval(spot=True, nodes=args.nodes, max_runtime=int(DAY), cost=args.checkpoint_cost).seconds
    policies = {"baseline (aws us-east-1 only)": (everything[:1], CKPT), "fallback (4 legs)": (everything, CKPT),
                f"fallback, auto {measured / 60:.1f}m measured": (everything, measured),
                f"fallback, auto {assumed / 60:.1f}m assumed": (everything, assumed)}
    rows = {}
    for name, (legs, interval) in policies.items():
        runs = [replay(seed, legs, args.work, args.gpus, args.nodes, args.max_restarts, interval,
                       args.checkpoint_cost) for seed in range(args.seeds)]
        rows[name] = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
    print(f"{args.seeds} seeded days, a job of {args.work:g} h on {args.nodes} x {args.gpus}, max_restarts "
          f"{args.max_restarts} per leg, {args.checkpoint_cost:g}s blocked per checkpoint, fixed interval "
          f"{CKPT / 60:g}m unless auto")
    print(f"{'policy':34} {'goodput':>8} {'finished':>9} {'hours':>6} {'cost $':>8} {'vs on-demand':>13} "
          f"{'legs':>5} {'resubmits':>10}")
    for name, r in rows.items():
        print(f"{name:34} {r['goodput']:8.3f} {r['finished']:9.2f} {r['hours']:6.1f} {r['cost']:8.0f} "
              f"{r['cost_vs_on_demand']:13.2f} {r['legs']:5.2f} {r['resubmissions']:10.2f}")
    names = list(rows)
    base, fall, auto = rows[names[0]], rows[names[1]], rows[names[2]]
    print(f"fallback / baseline: goodput x{fall['goodput'] / base['goodput']:.2f}, finished "
          f"{fall['finished']:.2f} vs {base['finished']:.2f}, cost x{fall['cost'] / base['cost']:.2f}, "
          f"cost vs on-demand {fall['cost_vs_on_demand']:.2f} vs {base['cost_vs_on_demand']:.2f}")
    print(f"auto (measured) / fixed {CKPT / 60:g}m, both with fallback: goodput "
          f"x{auto['goodput'] / fall['goodput']:.3f}, cost vs on-demand {auto['cost_vs_on_demand']:.3f} vs "
          f"{fall['cost_vs_on_demand']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
