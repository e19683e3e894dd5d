"""What the preemption soak (tests/soak.py) runs and records: its settings, the wrapped trainer that reports
progress and slows uploads (``SOAK_TRAINER``), the events and the report, and the helpers that inspect what a job
left behind."""


from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
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

from cloudtrain.checkpoint import store as checkpoint_store
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


def describe_and_upload(root, rel_paths, folder_uri, log=checkpoint_store._print, **kwargs):  # the Checkpointer's
    event("upload", int(folder_uri.rstrip("/").rsplit("-", 1)[1]))
    return _describe_and_upload(root, rel_paths, folder_uri, log=log, **kwargs)


def publish(folder_uri, step, files, **kwargs):
    _publish(folder_uri, step, files, **kwargs)
    event("published", step)


_atomic_write = local_store.atomic_write


def slow_atomic_write(target, writer):
    def slow(out):
        writer(out)
        if DELAY and str(target).startswith(STORE):
            time.sleep(DELAY)  # the temp file sits in the store, not yet renamed: an upload in flight

    _atomic_write(target, slow)


# the Checkpointer's files go to a file:// store as hard links (instant); the soak's store copies them, through the
# slowed atomic write above, so a kill lands while an upload's temp file sits in the store
local_store.LocalStore.link_file = local_store.LocalStore.put_file
Checkpointer.restore, Checkpointer.step, Checkpointer.save = restore, step, save
checkpoint_store.upload_files, checkpoint_store.describe_and_upload, checkpoint_store.publish = (
    upload_files, describe_and_upload, publish)
local_store.atomic_write = slow_atomic_write

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
    from cloudtrain.checkpoint import store as checkpoint_store

    extra: list[str] = []
    if not root.is_dir():
        return extra
    for folder in sorted(root.iterdir()):
        if folder.name == "_cloudtrain" and folder.is_dir():
            continue  # cloudtrain's own state beside the checkpoints (the URI's writer lease, a chain's state)
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
