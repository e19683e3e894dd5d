"""The toy scheduler as a cloudtrain provider: plans offline; submit stages the bundle in a file:// store and hands
the job to the scheduler (a spool folder and a runner process per job, runner.py); status, logs, cancel and list
read and write that folder. Written against cloudtrain's public provider API only (base.Provider, the translation,
nodes, staging)."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cloudtrain import storage
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
from cloudtrain.bundle.staging import bundle_prefix, new_job_id, stage_bundle
from cloudtrain.errors import HandleError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.home.paths import cloudtrain_home
from cloudtrain.naming import shortened
from cloudtrain.platforms.node_commands import bootstrap_args, job_env
from cloudtrain.providers.base import Capability, JobState, JobStatus, Provider
from cloudtrain.providers.translation import PlanContext, Planned, Translation
from toyprov import PROVIDER

# the scheduler's own states, and what they mean in cloudtrain's terms
STATES = {"QUEUED": JobState.PENDING, "RUNNING": JobState.RUNNING, "CANCELLING": JobState.STOPPING,
          "DONE": JobState.SUCCEEDED, "ERROR": JobState.FAILED, "KILLED": JobState.CANCELLED,
          "EVICTED": JobState.PREEMPTED}


class LostReply(ConnectionError):
    """The scheduler took the job, but its answer never came."""


def job_state(native: str) -> JobState:
    return STATES.get(native, JobState.PENDING)


class ToyProvider(Provider):
    declaration = PROVIDER  # its name, "toy", is stated there once
    capabilities = frozenset({Capability.MULTI_NODE})

    def __init__(self) -> None:
        self.lose_next_reply = False  # the tests' lever: the next create's answer is lost
        self.log_poll = 0.2

    @staticmethod
    def spool() -> Path:
        """The scheduler's folder: its jobs, their logs, and the store bundles are staged in."""
        return cloudtrain_home() / "toy-spool"

    # -- plan (pure) -----------------------------------------------------------------------------------
    def _translate(self, ctx: PlanContext) -> Translation:
        spec, package = ctx.spec, ctx.package  # the spec's settings filled in by the planner
        assert spec.name
        options = spec.providers.toy
        notes: list[str] = []
        queue = ctx.staged("queue", PROVIDER.placeholders["queue"], notes)  # submit refuses the placeholder
        spool = self.spool()
        job_id = shortened(new_job_id(spec.name), 48)  # the spool's rule (PROVIDER.name_pattern): the stamp stays
        prefix = bundle_prefix((spool / "store").as_uri(), package)
        bootstrap = str(storage.local_path(storage.join(prefix, BOOTSTRAP_NAME)))
        args = bootstrap_args(spec, bundle=storage.join(prefix, BUNDLE_NAME), digest=package.digest, workdir="work",
                              job_id=job_id, contract=PROVIDER.node_path(), nproc=self.processes(spec, 0))
        env = {"OMP_NUM_THREADS": "1", **job_env(spec)}
        nodes = ctx.node_commands(spec, job_id=job_id, python=sys.executable, bootstrap=bootstrap, args=args, env=env)
        request = {"queue": queue, "priority": options.priority, "digest": package.digest,
                   "nodes": [{"rank": n.rank, "argv": n.argv} for n in nodes]}
        return Translation(job_id=job_id, spec=spec, request=request, nodes=nodes, notes=notes,
                           staging={"prefix": prefix, "bundle": storage.join(prefix, BUNDLE_NAME), "spool": str(spool)})

    # -- submit ----------------------------------------------------------------------------------------
    def _submit(self, plan: Planned) -> JobHandle:
        spool = Path(plan.staging["spool"])
        stage_bundle(plan.package, plan.staging["prefix"], progress=False)

        def find() -> JobHandle | None:
            job = spool / plan.job_id / "job.json"
            if not job.is_file():
                return None
            if json.loads(job.read_text())["digest"] != plan.package.digest:
                raise UserError(f"a toy job named {plan.job_id} already exists and is not this plan's",
                                remedy="plan the job again (it gets a new name)")
            return self.handle(plan.job_id)

        def create() -> JobHandle:
            folder = spool / plan.job_id
            folder.mkdir(parents=True)
            nodes = [{"rank": n.rank, "argv": n.argv, "env": n.env} for n in plan.nodes]
            tmp = folder / "job.json.tmp"
            tmp.write_text(json.dumps({**plan.request, "nodes": nodes, "name": plan.spec.name}))
            os.replace(tmp, folder / "job.json")
            (folder / "state").write_text("QUEUED")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                              os.environ.get("PYTHONPATH")]))}
            with open(folder / "runner.log", "ab") as log:
                subprocess.Popen([sys.executable, "-m", "toyprov.runner", str(folder)], env=env, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            if self.lose_next_reply:
                self.lose_next_reply = False
                raise LostReply("the scheduler did not answer")
            return self.handle(plan.job_id)

        return self.created_once(find, create, lost=(LostReply,))

    # -- follow ----------------------------------------------------------------------------------------
    def _folder(self, handle: JobHandle) -> Path:
        folder = self.spool() / handle.job_id
        if not (folder / "job.json").is_file():
            raise HandleError(f"no toy job {handle.job_id}", remedy="`cloudtrain list --provider toy` shows them")
        return folder

    def _describe(self, handle: JobHandle) -> JobStatus:
        folder = self._folder(handle)
        native = (folder / "state").read_text().strip()
        return JobStatus(handle=handle, name=handle.job_id, state=job_state(native), message=native.lower(),
                         created_at=(folder / "job.json").stat().st_mtime, details={"toy_state": native})

    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        folder = self._folder(handle)
        offsets: dict[int, int] = {}

        def read() -> Iterator[str]:  # whole lines written since the last read
            for log in sorted(folder.glob("node-*.log")):
                rank = int(log.stem.split("-")[1])
                with open(log, "rb") as f:
                    f.seek(offsets.get(rank, 0))
                    data = f.read()
                cut = data.rfind(b"\n") + 1
                offsets[rank] = offsets.get(rank, 0) + cut
                yield from (f"[toy-node-{rank}] {line}" for line in data[:cut].decode(errors="replace").splitlines())

        return self.follow_logs(handle, follow, read, self.log_poll)

    def _cancel(self, handle: JobHandle) -> None:
        folder = self._folder(handle)
        (folder / "cancel").touch()
        runner = folder / "runner.pid"
        if runner.is_file():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(runner.read_text()), signal.SIGUSR1)

    def _list(self, limit: int) -> builtins.list[JobStatus]:
        spool = self.spool()
        if not spool.is_dir():
            return []
        folders = sorted((f for f in spool.iterdir() if (f / "job.json").is_file()),
                         key=lambda f: (f / "job.json").stat().st_mtime, reverse=True)
        return [self._describe(self.handle(f.name)) for f in folders[:limit]]
