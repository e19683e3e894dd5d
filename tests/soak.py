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

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KINDS = ("sigterm", "sigkill")
MOMENTS = ("startup", "step", "save", "upload")
SAMPLES, BATCH = 1024, 32  # train_fsdp.py's defaults: with world size 4, 8 steps per epoch

SOAK_TRAINER = '''\
"""train_fsdp.py with progress events for the soak driver, and a slow link to the checkpoint store."""

import os
import time

from cloudtrain.node import checkpoint_store
from cloudtrain.runtime import checkpointer
from cloudtrain.storage import local as local_store

EVENTS, DELAY = os.environ["SOAK_EVENTS"], float(os.environ.get("SOAK_UPLOAD_DELAY", "0"))
STORE = str(local_store.local_path(os.environ["CLOUDTRAIN_CHECKPOINT_URI"]))
RANK0 = os.environ.get("RANK") == "0"


def event(kind, value):
    if RANK0:  # one short append per line: a killed writer leaves at most a partial last line
        with open(EVENTS, "a") as f:
            f.write(f"{time.time():.3f} {os.environ['CLOUDTRAIN_JOB_ID']} {os.getpid()} {kind} {value}\\n")


Checkpointer = checkpointer.Checkpointer
_restore, _step, _save = Checkpointer.restore, Checkpointer.step, Checkpointer.save


def restore(self):
    step = _restore(self)
    event("begin", step)
    return step


def step(self, n):
    event("step", n)
    _step(self, n)


def save(self, n, block=False):
    if n != self.last_saved_step:
        event("save", n)
    _save(self, n, block)


_upload, _describe_and_upload, _publish = (checkpoint_store.upload_files, checkpoint_store.describe_and_upload,
                                           checkpoint_store.publish)


def upload_files(root, files, folder_uri, log=checkpoint_store._print):
    event("upload", int(folder_uri.rstrip("/").rsplit("-", 1)[1]))
    return _upload(root, files, folder_uri, log=log)


def describe_and_upload(root, rel_paths, folder_uri, log=checkpoint_store._print):  # the Checkpointer's upload
    event("upload", int(folder_uri.rstrip("/").rsplit("-", 1)[1]))
    return _describe_and_upload(root, rel_paths, folder_uri, log=log)


def publish(folder_uri, step, files, **kwargs):
    _publish(folder_uri, step, files, **kwargs)
    event("published", step)


_atomic_write = local_store._atomic_write


def slow_atomic_write(target, writer):
    def slow(out):
        writer(out)
        if DELAY and str(target).startswith(STORE):
            time.sleep(DELAY)  # the temp file sits in the store, not yet renamed: an upload in flight

    _atomic_write(target, slow)


Checkpointer.restore, Checkpointer.step, Checkpointer.save = restore, step, save
checkpoint_store.upload_files, checkpoint_store.describe_and_upload, checkpoint_store.publish = (
    upload_files, describe_and_upload, publish)
local_store._atomic_write = slow_atomic_write

import train_fsdp  # noqa: E402 - after the patches

train_fsdp.main()
'''


@dataclass
class SoakConfig:
    interruptions: int = 20
    seed: int = 1
    epochs: int | None = None  # default: enough steps for every interruption to land mid-training
    checkpoint_every: int = 4
    step_sleep: float = 0.05  # seconds per step, in every run (the arithmetic does not depend on it)
    upload_delay: float = 0.15  # seconds each file written to the store stays a temp file
    width: int = 128
    depth: int = 4
    keep: int = 2
    nodes: int = 2
    procs_per_node: int = 2
    schedule: list[tuple[str, str]] | None = None  # (kind, moment) pairs; default: drawn from the seed
    timeout: float = 180  # seconds any single wait may take
    log: Callable[[str], None] = print

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def steps_per_epoch(self) -> int:
        return SAMPLES // self.world_size // BATCH

    def epochs_needed(self) -> int:
        if self.epochs is not None:
            return self.epochs
        # an interruption aims at most 2 checkpoint intervals (+1 for a SIGTERM's final save) past where the attempt
        # resumed: enough steps that the job cannot finish before the last interruption
        steps = (self.interruptions + 2) * (2 * self.checkpoint_every + 1)
        return max(2, -(-steps // self.steps_per_epoch))

    def draw_schedule(self, rng: random.Random) -> list[tuple[str, str]]:
        """Both kinds in every pair, every moment once per kind in every 8: any prefix of 2+ has both kinds."""
        if self.schedule is not None:
            return list(self.schedule)
        out: list[tuple[str, str]] = []
        while len(out) < self.interruptions:
            term, kill = rng.sample(MOMENTS, len(MOMENTS)), rng.sample(MOMENTS, len(MOMENTS))
            for t, k in zip(term, kill, strict=True):
                pair = [("sigterm", t), ("sigkill", k)]
                rng.shuffle(pair)
                out += pair
        return out[: self.interruptions]


@dataclass
class Event:
    t: float
    job: str
    pid: int
    kind: str
    value: int


class Events:
    """The trainers' progress, read incrementally; an attempt is one rank-0 process (job id, pid)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos = path, 0
        self.all: list[Event] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def poll(self) -> list[Event]:
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a partial last line is read again next time
        self.pos += end
        new = []
        for line in data[:end].decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 5 and parts[4].lstrip("-").isdigit():
                new.append(Event(float(parts[0]), parts[1], int(parts[2]), parts[3], int(parts[4])))
        self.all += new
        return new


@dataclass
class Attempt:
    job: str
    pid: int
    begin: int
    last_step: int


@dataclass
class Interruption:
    kind: str
    moment: str
    job: str
    at_step: int | None  # the last step the attempt reported when it was hit (None: before training started)
    in_flight: str  # what the checkpointer was doing: "save N in flight" or "idle"
    store_partial: list[str]  # after a SIGKILL: step folders without a manifest, and temp files, in the store


@dataclass
class SoakReport:
    config: dict[str, Any]
    total_steps: int = 0
    baseline_seconds: float = 0.0
    soak_seconds: float = 0.0
    interruptions: list[Interruption] = field(default_factory=list)
    restarts: int = 0
    resubmissions: int = 0
    attempts: int = 0
    steps_redone: int = 0
    checkpoints_lost: int = 0
    kept_steps: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {
            "interruptions": len(self.interruptions),
            "by_kind": dict(Counter(i.kind for i in self.interruptions)),
            "by_moment": dict(Counter(f"{i.kind}/{i.moment}" for i in self.interruptions)),
            "hit_a_save_in_flight": sum(i.in_flight != "idle" for i in self.interruptions),
            "restarts": self.restarts,
            "resubmissions": self.resubmissions,
            "attempts": self.attempts,
            "total_steps": self.total_steps,
            "steps_redone": self.steps_redone,
            "checkpoints_lost": self.checkpoints_lost,
            "kept_checkpoints": self.kept_steps,
            "baseline_seconds": round(self.baseline_seconds, 1),
            "soak_seconds": round(self.soak_seconds, 1),
            "ratio": round(self.soak_seconds / self.baseline_seconds, 2) if self.baseline_seconds else None,
            "problems": self.problems,
        }

    def text(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.figures().items()]
        lines += [f"  #{n + 1} {i.kind}/{i.moment} job={i.job} at_step={i.at_step} {i.in_flight}"
                  + (f" partial={i.store_partial}" if i.store_partial else "")
                  for n, i in enumerate(self.interruptions)]
        return "\n".join(lines)


def cli_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["CLOUDTRAIN_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class Cloudtrain:
    """The CLI as a user runs it, bound to one cloudtrain home."""

    def __init__(self, home: Path, cwd: Path) -> None:
        self.home, self.cwd = home, cwd

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=self.cwd, env=cli_env(self.home),
                                capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    def logs(self, handle: str) -> str:
        return self("logs", handle).stdout


def final_weights(output_dir: Path) -> dict[str, Any]:
    import torch

    return torch.load(output_dir / "model.pt", weights_only=True)


def weights_differ(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    import torch

    if a.keys() != b.keys():
        return [f"keys differ: {sorted(a.keys() ^ b.keys())}"]
    return [key for key in a if not torch.equal(a[key], b[key])]


def home_processes(home: Path) -> list[int]:
    """Every live process started for this cloudtrain home (supervisors, bootstraps, torchrun, workers, syncers):
    they all inherit CLOUDTRAIN_HOME, and /proc finds them even after they were re-parented."""
    needle = f"CLOUDTRAIN_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def store_leftovers(root: Path) -> list[str]:
    """Files and folders in a file:// checkpoint store that no complete checkpoint accounts for: step folders without
    a manifest, files not in their manifest (temp ``.part`` files of a killed upload included), stray folders."""
    from cloudtrain.node import checkpoint_store

    extra: list[str] = []
    if not root.is_dir():
        return extra
    for folder in sorted(root.iterdir()):
        if not (folder.is_dir() and re.fullmatch(r"step-\d+", folder.name)):
            extra.append(folder.name)
            continue
        manifest_path = folder / checkpoint_store.MANIFEST
        listed: set[str] = set()
        if manifest_path.is_file():
            try:
                listed = {f["path"] for f in json.loads(manifest_path.read_text())["files"]}
            except (ValueError, KeyError, TypeError):
                extra.append(f"{folder.name}/{checkpoint_store.MANIFEST} (unreadable)")
        else:
            extra.append(f"{folder.name}/ (no manifest)")
        listed.add(checkpoint_store.MANIFEST)
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_file() and rel not in listed:
                extra.append(f"{folder.name}/{rel}")
    return extra


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
        from cloudtrain.procs import is_alive

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
        from cloudtrain.procs import kill_tagged, signal_group, tag_alive

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
        from cloudtrain.handles import JobHandle
        from cloudtrain.node import checkpoint_store
        from cloudtrain.procs import tag_alive

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
            stop_every_job(home)


def stop_every_job(home: Path) -> None:
    from cloudtrain.procs import kill_tagged

    for pid in home_processes(home):  # supervisors first would race their restarts: kill everything we started
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    if (home / "jobs.db").exists():
        from cloudtrain.providers.local.provider import LocalProvider

        for record in LocalProvider(home).db.list(1000):
            for node in record.nodes:
                kill_tagged(node.get("tag"))
