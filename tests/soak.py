"""Preemption soak: a local FSDP job (2 nodes x 2 processes) interrupted many times at random moments must end
bitwise equal to an uninterrupted run, leave no process behind and no file in its checkpoint store beyond retention.

The one implementation behind ``tests/test_soak.py`` (reduced, in CI) and ``benchmarks/soak.py`` (full).

Interruptions mix two kinds: ``sigterm`` (``preempt``: every node gets SIGTERM, the trainers take a final checkpoint,
the supervisor restarts the job) and ``sigkill`` (every node's process group and tagged processes are SIGKILLed: no
final save, the job fails and the same command is submitted again). Each lands at one of four moments: ``startup``
(bundle unpack, restore, rendezvous), ``step`` (a random point between steps), ``save`` (right after a checkpoint
save started: staging / writing) and ``upload`` (while a checkpoint's files are being uploaded to the store).

The job runs ``entrypoints/train_fsdp.py`` unchanged, through a thin wrapper (``SOAK_TRAINER``) that reports progress
to an events file (a step, a save started, an upload started, a checkpoint published) so the driver can aim, and
that slows every write into the checkpoint store by ``upload_delay`` seconds with the temp file in place (a slow
link), so that "during an upload" is a window one can hit. Neither touches the training arithmetic.
"""


from __future__ import annotations

import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudtrain.testing.fixtures import stop_every_job
from tests.soak_job import (
    REPO,
    SOAK_TRAINER,
    Attempt,
    Cloudtrain,
    Event,
    Events,
    Interruption,
    SoakConfig,
    SoakReport,
    final_weights,
    home_processes,
    store_leftovers,
    weights_differ,
)


class Soak:
    """One soak: the baseline run, the interrupted run, and the checks."""

    def __init__(self, root: Path, config: SoakConfig) -> None:
        self.root, self.cfg = root, config
        self.rng = random.Random(config.seed)
        self.report = SoakReport(config={k: v for k, v in vars(config).items() if k != "log"})
        self.report.config["epochs"] = config.epochs_needed()
        self.report.total_steps = config.epochs_needed() * config.steps_per_epoch

    # -- setup -----------------------------------------------------------------------------------------
    def project(self, where: Path) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "entrypoints" / "train_fsdp.py", where / "train_fsdp.py")
        (where / "soak_train.py").write_text(SOAK_TRAINER)
        return where / "soak_train.py"

    def submit_args(self, run: Path, events: Path, *flags: str) -> list[str]:
        c = self.cfg
        return ["submit", *flags, str(self.project(run / "proj")), "--nodes", str(c.nodes),
                "--procs-per-node", str(c.procs_per_node), "--checkpoint-uri", (run / "ckpt").as_uri(),
                "--output-uri", (run / "out").as_uri(), "--set", f"checkpoint.keep={c.keep}",
                "--env", f"SOAK_EVENTS={events}", "--env", f"SOAK_UPLOAD_DELAY={c.upload_delay}",
                "--max-restarts", str(c.interruptions + 1),
                "--", "--epochs", str(c.epochs_needed()), "--checkpoint-every", str(c.checkpoint_every),
                "--step-sleep", str(c.step_sleep), "--width", str(c.width), "--depth", str(c.depth)]

    # -- baseline --------------------------------------------------------------------------------------
    def baseline(self) -> dict[str, Any]:
        run = self.root / "baseline"
        ct = Cloudtrain(run / "home", run)
        events = Events(run / "events.log")
        started = time.monotonic()
        done = ct(*self.submit_args(run, events.path))
        self.report.baseline_seconds = time.monotonic() - started
        events.poll()
        steps = [e.value for e in events.all if e.kind == "step"]
        if not steps or max(steps) != self.report.total_steps or "INFO resumed from step" in done.stdout:
            self.report.problems.append(f"baseline did not run {self.report.total_steps} steps from scratch "
                                        f"(last step {max(steps, default=None)})")
        self.cfg.log(f"baseline: {self.report.total_steps} steps in {self.report.baseline_seconds:.1f}s")
        return final_weights(run / "out")

    # -- the interrupted run ---------------------------------------------------------------------------
    def run(self) -> SoakReport:
        from cloudtrain.handles import JobHandle
        from cloudtrain.providers.local.provider import LocalProvider

        expected = self.baseline()
        run = self.root / "soak"
        self.home = run / "home"
        self.ct = Cloudtrain(self.home, run)
        self.provider = LocalProvider(self.home)  # in-process, for status and preempt at a precise moment
        self.events = Events(run / "events.log")
        self.ckpt_root = run / "ckpt"
        self.submit = self.submit_args(run, self.events.path, "--detach")
        self.seen: set[tuple[str, int]] = set()
        self.jobs: list[str] = []
        started = time.monotonic()
        self.handle = self.start_job()
        self.attempt_started = time.monotonic()
        for kind, moment in self.cfg.draw_schedule(self.rng):
            if not self.interrupt(kind, moment, JobHandle.parse(self.handle)):
                self.report.problems.append(f"the job finished before interruption "
                                            f"{len(self.report.interruptions) + 1} ({kind}/{moment})")
                break
        state = self.wait_terminal(JobHandle.parse(self.handle), timeout=self.cfg.timeout * 2)
        self.report.soak_seconds = time.monotonic() - started
        if state != "succeeded":
            self.report.problems.append(f"final job {self.handle} ended {state}:\n" + self.ct.logs(self.handle)[-4000:])
        else:
            diff = weights_differ(final_weights(run / "out"), expected)
            if diff:
                self.report.problems.append(f"final weights differ from the uninterrupted run's: {diff[:5]}")
        self.account()
        self.check_cleanup()
        return self.report

    def start_job(self) -> str:
        handle = self.ct(*self.submit).stdout.strip().splitlines()[-1]
        self.jobs.append(handle.rsplit("/", 1)[-1])
        return handle

    def status(self, handle: Any) -> Any:
        return self.provider.describe(handle)

    def wait_terminal(self, handle: Any, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.status(handle).state.value
            if state not in ("pending", "running", "stopping"):
                return str(state)
            time.sleep(0.2)
        return "timed out"

    def current_attempt(self) -> tuple[str, int] | None:
        """The newest attempt of the current job that has reported it began training."""
        job = self.jobs[-1]
        begun = [(e.job, e.pid) for e in self.events.all if e.kind == "begin" and e.job == job]
        return begun[-1] if begun and begun[-1] not in self.seen else None

    def await_event(self, match: Callable[[Event], bool], handle: Any) -> Event | None:
        """Poll the events (every few ms) until one matches; None if the job ended first."""
        deadline = time.monotonic() + self.cfg.timeout
        next_status = 0.0
        while time.monotonic() < deadline:
            for event in self.events.poll():
                if match(event):
                    return event
            if time.monotonic() > next_status:
                if self.status(handle).state.value not in ("pending", "running", "stopping"):
                    return None
                next_status = time.monotonic() + 0.5
            time.sleep(0.003)
        raise AssertionError(f"no expected event within {self.cfg.timeout}s; job {self.handle}:\n"
                             + self.ct.logs(self.handle)[-4000:])

    def interrupt(self, kind: str, moment: str, handle: Any) -> bool:
        """Aim at the moment, fire, and see the job back to work (restarted or resubmitted). False if the job
        finished before the moment came."""
        c, job = self.cfg, self.jobs[-1]
        attempt: tuple[str, int] | None = None
        if moment == "startup":
            # a random point of the restart: unpack, restore, rendezvous (several seconds on a small machine)
            fire_at = self.attempt_started + self.rng.uniform(0.5, 4.0)
            while self.status(handle).state.value == "pending":
                time.sleep(0.05)
            while time.monotonic() < fire_at and self.current_attempt() is None:
                self.events.poll()
                time.sleep(0.01)
            attempt = self.current_attempt()
        else:
            begin = self.await_event(lambda e: e.kind == "begin" and e.job == job and (e.job, e.pid) not in self.seen,
                                     handle)
            if begin is None:
                return False
            attempt = (begin.job, begin.pid)
            mine = lambda e, k: (e.job, e.pid) == attempt and e.kind == k  # noqa: E731
            if moment == "step":
                target = begin.value + self.rng.randint(1, 2 * c.checkpoint_every)
                if self.await_event(lambda e: mine(e, "step") and e.value >= target, handle) is None:
                    return False
                time.sleep(self.rng.uniform(0, c.step_sleep))
            elif moment == "save":
                if self.await_event(lambda e: mine(e, "save"), handle) is None:
                    return False
                time.sleep(self.rng.uniform(0, 0.02))  # staging and writing take tens of ms here
            else:
                if self.await_event(lambda e: mine(e, "upload"), handle) is None:
                    return False
                time.sleep(self.rng.uniform(0, c.upload_delay))
        self.events.poll()
        mine_all = [e for e in self.events.all if attempt and (e.job, e.pid) == attempt]
        steps = [e.value for e in mine_all if e.kind == "step"]
        saves = [e.value for e in mine_all if e.kind == "save"]
        published = [e.value for e in mine_all if e.kind == "published"]
        in_flight = f"save {saves[-1]} in flight" if saves and saves[-1] not in published else "idle"
        record = Interruption(kind, moment, job, steps[-1] if steps else None, in_flight, [])
        status = self.status(handle)
        if status.state.value != "running":
            return False
        self.report.interruptions.append(record)
        if kind == "sigterm":
            self.preempt(handle, status.restarts)
        else:
            self.kill(handle, status.nodes, record)
        self.retire()
        c.log(f"interruption {len(self.report.interruptions)}: {kind}/{moment} at step {record.at_step} "
              f"({in_flight})")
        return True

    def retire(self) -> None:
        """Called once the interrupted processes are gone and the next attempt is starting (it needs seconds before
        it can report): every attempt that reported so far is an old one, whatever it still wrote while dying."""
        self.attempt_started = time.monotonic()
        self.events.poll()
        self.seen.update((e.job, e.pid) for e in self.events.all)

    def preempt(self, handle: Any, restarts: int) -> None:
        """SIGTERM to every node, as `cloudtrain preempt` sends it; the supervisor restarts the job."""
        from cloudtrain.home.procs import is_alive

        old = [n["pid"] for n in self.status(handle).nodes]
        self.provider.preempt(handle)
        deadline = time.monotonic() + self.cfg.timeout
        while time.monotonic() < deadline:
            status = self.status(handle)
            if status.restarts > restarts or status.state.value not in ("pending", "running", "stopping"):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"{self.handle} was not restarted after preemption")
        current = {n["pid"] for n in self.status(handle).nodes}
        alive = [pid for pid in old if is_alive(pid) and pid not in current]
        if alive:
            self.report.problems.append(f"preempted nodes {alive} still alive after the restart")

    def kill(self, handle: Any, nodes: list[dict[str, Any]], record: Interruption) -> None:
        """SIGKILL every node (the machines are simply gone), then submit the same job again."""
        from cloudtrain.home.procs import kill_tagged, signal_group, tag_alive

        for node in nodes:
            signal_group(node["pid"], signal.SIGKILL)
            kill_tagged(node["tag"], signal.SIGKILL)
        record.store_partial = store_leftovers(self.ckpt_root)
        state = self.wait_terminal(handle, timeout=60)
        if state != "failed":
            self.report.problems.append(f"{self.handle} ended {state!r} after SIGKILL, expected 'failed'")
        deadline = time.monotonic() + 10
        while any(tag_alive(n["tag"]) for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.1)
        if any(tag_alive(n["tag"]) for n in nodes):
            self.report.problems.append(f"processes of {self.handle} survived SIGKILL")
        self.report.resubmissions += 1
        self.handle = self.start_job()

    # -- figures and checks ----------------------------------------------------------------------------
    def account(self) -> None:
        """Work lost (steps computed twice) and checkpoints lost (a resume older than the newest published)."""
        from cloudtrain.handles import JobHandle

        self.events.poll()
        attempts: dict[tuple[str, int], Attempt] = {}
        published = 0
        for e in self.events.all:
            key = (e.job, e.pid)
            if e.kind == "begin":
                if e.value < published:
                    self.report.checkpoints_lost += 1
                    self.report.problems.append(f"attempt {key} resumed from step {e.value}; step {published} "
                                                "had been published")
                attempts[key] = Attempt(e.job, e.pid, e.value, e.value)
            elif e.kind == "step" and key in attempts:
                attempts[key].last_step = max(attempts[key].last_step, e.value)
            elif e.kind == "published":
                published = max(published, e.value)
        done = sum(a.last_step - a.begin for a in attempts.values())
        self.report.attempts = len(attempts)
        self.report.steps_redone = done - self.report.total_steps
        self.report.restarts = sum(self.status(JobHandle("local", job)).restarts for job in self.jobs)

    def check_cleanup(self) -> None:
        from cloudtrain.checkpoint import store as checkpoint_store
        from cloudtrain.handles import JobHandle
        from cloudtrain.home.procs import tag_alive

        deadline = time.monotonic() + 15  # a supervisor records the end, then exits
        while home_processes(self.home) and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans = home_processes(self.home)
        tags = [n["tag"] for job in self.jobs for n in self.status(JobHandle("local", job)).nodes]
        if orphans or any(tag_alive(t) for t in tags):
            described = []
            for pid in orphans:
                try:
                    described.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                                     .decode(errors="replace")[:200])
                except OSError:
                    continue
            self.report.problems.append("orphan processes: " + "; ".join(described))
        kept = [c.step for c in checkpoint_store.list_complete(self.ckpt_root.as_uri(), log=lambda _m: None)]
        self.report.kept_steps = kept
        if len(kept) != self.cfg.keep:
            self.report.problems.append(f"the store holds {len(kept)} complete checkpoints {kept}, "
                                        f"retention keeps {self.cfg.keep}")
        leftovers = store_leftovers(self.ckpt_root)
        if leftovers:
            self.report.problems.append(f"files in the checkpoint store beyond retention: {leftovers}")
        # the finished job's nodes keep their newest checkpoint folder only, and no temp file
        final_job = Path(self.status(JobHandle.parse(self.handle)).details["job_dir"])
        for local in sorted(final_job.glob("node-*/checkpoints")):
            extra = sorted(p.name for p in local.iterdir() if p.name != checkpoint_store.RUNTIME_MARKER)
            if len(extra) > 1:
                self.report.problems.append(f"{local} holds {extra}; the newest checkpoint folder only expected")
        # the output holds what the trainer wrote and, beside it, each node's logs (bootstrap copies them at exit)
        output = self.root / "soak" / "out"
        out = sorted(p.name for p in output.iterdir())
        nodes = sorted(p.name for p in (output / "logs").iterdir()) if (output / "logs").is_dir() else []
        if out != ["logs", "model.pt"] or nodes != [f"node-{rank}" for rank in range(self.cfg.nodes)]:
            self.report.problems.append(f"output folder holds {out}, logs {nodes}")


def run_soak(root: Path, config: SoakConfig) -> SoakReport:
    """Run the baseline and the soak under ``root``; every job is stopped before returning, whatever happened."""
    soak = Soak(root, config)
    try:
        return soak.run()
    finally:
        for home in (root / "baseline" / "home", root / "soak" / "home"):
            end_home(home)


def end_home(home: Path) -> None:
    """Supervisors first would race their restarts: every process started for ``home`` is killed, then the shipped
    stop_every_job ends what the job records still name."""
    for pid in home_processes(home):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    stop_every_job(home)
