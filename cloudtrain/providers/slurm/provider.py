"""Slurm as a cloudtrain provider.

plan (pure): the batch script and the sbatch command, with every node's bootstrap line. submit: stage the bundle in
the staging folder on the shared filesystem (content-addressed, as the clouds' buckets), write the job's folder
(script, its variables, a record) and ``sbatch`` it. The handle is ``slurm://<job id>``, the job's name in Slurm;
status asks slurmctld while it holds the job and Slurm's records (sacct, or ``sacct -c``) after; logs read each
node's log in the job's folder; cancel is scancel.
"""

from __future__ import annotations

import builtins
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cloudtrain import storage
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
from cloudtrain.bundle.staging import bundle_prefix, default_output_uri, lineage_id, new_job_id
from cloudtrain.errors import HandleError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import Capability, JobState, JobStatus, Summary
from cloudtrain.node.outcome import warned_message
from cloudtrain.platforms.catalog import Machine
from cloudtrain.platforms.node_commands import bootstrap_args, job_env
from cloudtrain.providers.base import Provider
from cloudtrain.providers.slurm import PROVIDER, clients
from cloudtrain.providers.slurm import request as rq
from cloudtrain.providers.slurm.files import SharedFiles
from cloudtrain.providers.slurm.node import PORT_BASE, PORT_SPAN
from cloudtrain.providers.slurm.options import SlurmOptions
from cloudtrain.providers.slurm.status import job_state
from cloudtrain.providers.translation import PlanContext, Planned, Translation
from cloudtrain.spec.model import JobSpec

_JOB_NAME = re.compile(r"^[a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{4}(-r\d+)?$")  # cloudtrain's job ids (staging.new_job_id)


class LostReply(ConnectionError):
    """sbatch submitted the job, but its answer never came (the tests' lever: ``lose_next_reply``)."""


def plan_summary(plan: Planned) -> Summary:
    """The plan summary's Slurm line: the nodes are the ones the cluster gives the job."""
    return Summary(instance="the nodes the cluster gives the job")


class SlurmProvider(Provider):
    declaration = PROVIDER
    # spot: the cluster's preemptible capacity
    capabilities = frozenset({Capability.MULTI_NODE, Capability.ACCELERATORS, Capability.SPOT})
    poll_seconds = 2.0  # squeue answers in milliseconds; a shared slurmctld deserves some restraint

    def __init__(self, log_poll: float = 1.0) -> None:
        self.log_poll = log_poll
        self.lose_next_reply = False

    # -- plan (pure) -------------------------------------------------------------------------------------
    def _translate(self, ctx: PlanContext) -> Translation:
        spec, package = ctx.spec, ctx.package  # its settings filled once, by the planner
        assert spec.name
        options = spec.providers.slurm
        notes: list[str] = []
        staging = ctx.staged("staging", PROVIDER.placeholders["staging"], notes)
        job_id = new_job_id(spec.name)
        home = Path(staging).as_uri()
        spec = spec.model_copy(deep=True)
        if spec.max_restarts and not spec.checkpoint.uri:
            spec.checkpoint.uri = f"{home}/checkpoints/{lineage_id(spec)}"
            notes.append(f"slurm: requeued runs resume from {spec.checkpoint.uri} (set checkpoint.uri to choose)")
        spec.output_uri = spec.output_uri or default_output_uri(home, job_id)
        layout = rq.Layout(f"{staging}/jobs/{job_id}")
        prefix = bundle_prefix(home, package)
        bootstrap = str(storage.local_path(storage.join(prefix, BOOTSTRAP_NAME)))
        args = bootstrap_args(spec, bundle=storage.join(prefix, BUNDLE_NAME), digest=package.digest,
                              workdir=rq.WORKDIR, job_id=job_id, contract=PROVIDER.node_path(),
                              nproc=self.processes(spec, spec.gpus_per_node), status_file=rq.STATUS_FILE)
        env = job_env(spec)
        nodes = ctx.node_commands(spec, job_id=job_id, python=options.python, bootstrap=bootstrap, args=args,
                                   env=env)
        script = rq.batch_script(spec, options, job_id, layout, nodes[0].argv, package.digest)
        request = {"sbatch": ["sbatch", "--parsable", layout.script], "script_path": layout.script,
                   "script": script.splitlines(), "env_file": layout.env_file, "env": env, "job_dir": layout.job_dir,
                   "max_restarts": spec.max_restarts, "login": options.login}
        limit = rq.time_limit(spec.max_runtime)
        notes.append(f"slurm: --time={limit} (max_runtime, in whole minutes); the nodes get SIGTERM "
                     f"{min(options.grace_period, spec.max_runtime)}s before it and take a final checkpoint")
        notes.append(f"slurm: --requeue: a preempted or requeued job runs again, up to max_restarts "
                     f"({spec.max_restarts}) times, each run resuming from its newest checkpoint" if spec.max_restarts
                     else "slurm: --no-requeue (max_restarts 0): a preempted job ends preempted")
        if spec.spot:  # the starter spec says spot: true; on Slurm that is the cluster's preemptible capacity
            notes.append("slurm: spot: Slurm has no spot market; preemptible capacity is the cluster's own (set "
                         "providers.slurm.partition or qos to a preemptible one, if it has one), and a preempted job "
                         + (f"is requeued (max_restarts {spec.max_restarts})" if spec.max_restarts else
                            "ends preempted (max_restarts 0)"))
        notes.append(f"slurm: the rendezvous is the first node, port {PORT_BASE} + (job id x 7 + restarts) mod "
                     f"{PORT_SPAN}: known once Slurm gives the job its id")
        return Translation(job_id=job_id, spec=spec, request=request, nodes=nodes,
                           staging={"prefix": prefix, "bundle": storage.join(prefix, BUNDLE_NAME), "folder": staging},
                           notes=notes, machine=_machine(spec, options), image=_environment(options),
                           estimate={"available": False, "reason": "none: Slurm lists no prices (the cluster's own "
                                                                   "allocation or fair-share accounting applies)"})

    # -- submit ------------------------------------------------------------------------------------------
    def commands(self, login: str | None = None) -> clients.Commands:
        """Slurm's commands here, or on the login host: the plan's, else the one configured (environment, profile:
        a handle alone does not say)."""
        return clients.Commands(login or self.setting("login"))

    def _submit(self, plan: Planned) -> JobHandle:
        request, handle = plan.request, self.handle(plan.job_id)
        layout = rq.Layout(request["job_dir"])
        slurm = self.commands(request.get("login"))
        shared = SharedFiles(slurm)

        def find() -> JobHandle | None:
            record = shared.read_json(layout.record)
            if not record:
                return None
            if record.get("digest") != plan.package.digest:
                raise UserError(f"a Slurm job folder {layout.job_dir} exists and is not this plan's",
                                remedy="plan the job again (it gets a new name)")
            return handle if slurm.ids_named(plan.job_id) or self._ended(slurm, plan.job_id) else None

        def create() -> JobHandle:
            shared.write(layout.env_file, rq.env_file(request["env"]).encode(), private=True)  # secrets: yours only
            shared.write(layout.script, ("\n".join(request["script"]) + "\n").encode())
            meta = {"job_id": plan.job_id, "digest": plan.package.digest, "output_uri": plan.spec.output_uri,
                    "checkpoint_uri": plan.spec.checkpoint.uri, "max_restarts": plan.spec.max_restarts,
                    "nodes": plan.spec.nodes}
            shared.write(layout.record, json.dumps(meta, indent=1).encode())
            slurm_id = slurm.sbatch(layout.script)
            shared.write(layout.record, json.dumps({**meta, "slurm_job_id": slurm_id}, indent=1).encode())
            if self.lose_next_reply:
                self.lose_next_reply = False
                raise LostReply("sbatch did not answer")
            return handle

        slurm.run(["sbatch", "--version"])  # there and working, before anything is staged
        refused = shared.writable(plan.staging["folder"])
        if refused:
            raise UserError(f"staging folder {plan.staging['folder']} cannot be written"
                            + (f" on {slurm.login}" if slurm.login else " here") + f": {refused}",
                            field="providers.slurm.staging",
                            remedy="choose a folder you can write on the cluster's shared filesystem")
        shared.stage(plan.package, plan.staging["prefix"], str(storage.local_path(plan.staging["prefix"])))
        return self.created_once(find, create, lost=(LostReply,))

    # -- follow ------------------------------------------------------------------------------------------
    def _job(self, slurm: clients.Commands, name: str) -> dict[str, str]:
        """The job as slurmctld holds it (scontrol), else as Slurm recorded its last run (sacct)."""
        for slurm_id in reversed(slurm.ids_named(name)):
            shown = slurm.show_job(slurm_id)
            if shown:
                return {**shown, "source": "scontrol"}
        ended = self._ended(slurm, name)
        if ended:
            return {**ended, "JobState": ended["State"], "SubmitTime": ended["Submit"],
                    "StartTime": ended["Start"], "EndTime": ended["End"], "source": "sacct"}
        raise HandleError(f"Slurm has no job named {name}" + (f" (on {slurm.login})" if slurm.login else ""),
                          remedy="`cloudtrain list --provider slurm` shows them (set providers.slurm.login, e.g. "
                                 "CLOUDTRAIN_SLURM_LOGIN, for jobs submitted over SSH)")

    @staticmethod
    def _ended(slurm: clients.Commands, name: str) -> dict[str, str] | None:
        rows = [row for row in slurm.accounting(name) if row["JobName"] == name]
        return rows[-1] if rows else None

    def _describe(self, handle: JobHandle) -> JobStatus:
        slurm = self.commands()
        job = self._job(slurm, handle.job_id)
        native, code = job.get("JobState", ""), job.get("ExitCode", "0:0")
        state, message = job_state(native, code)
        restarts = int(job.get("Restarts", "0") or 0)
        record = _recorded(SharedFiles(slurm).read_json(f"{job.get('WorkDir', '')}/job.json"))
        if state is JobState.PENDING and restarts:
            message = f"requeued (run {restarts + 1}): resumes from its newest checkpoint"
        if state is JobState.SUCCEEDED and job.get("WorkDir"):  # what the nodes warned of at their end
            message = "; ".join(filter(None, [message, _warned(slurm, job["WorkDir"], record.get("nodes", 1))]))
        reason = job.get("Reason", "None")
        if not state.terminal and reason not in ("None", "", "(null)"):
            message += f" ({reason})"
        details: dict[str, Any] = {
            "slurm_job_id": job.get("JobId") or job.get("JobID"), "slurm_state": native, "exit_code": code,
            "job_dir": job.get("WorkDir"), "node_list": job.get("NodeList"), "source": job["source"],
            "login": slurm.login}
        return JobStatus(handle=handle, name=handle.job_id, state=state, message=message,
                         created_at=_epoch(job.get("SubmitTime")), started_at=_epoch(job.get("StartTime")),
                         ended_at=_epoch(job.get("EndTime")) if state.terminal else None, details=details,
                         state_since=_epoch(job.get("EndTime")) if state.terminal else
                         _epoch(job.get("StartTime")) if state is JobState.RUNNING else None,
                         restarts=restarts, max_restarts=record.get("max_restarts") or 0,
                         output_uri=record.get("output_uri"), checkpoint_uri=record.get("checkpoint_uri"))

    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        slurm = self.commands()
        shared = SharedFiles(slurm)
        folder = self._job(slurm, handle.job_id).get("WorkDir", "")
        offsets: dict[str, int] = {}
        partial: dict[str, bytes] = {}

        def read() -> Iterator[str]:  # the whole lines each log gained since the last read
            for log in [*shared.logs(folder), f"{folder}/batch.log"]:
                source = log.rsplit("/", 1)[1].removesuffix(".log") if "/node-" in log else "batch"
                data = shared.read(log, offsets.get(source, 0))
                if data is None:
                    continue
                cut = data.rfind(b"\n") + 1
                offsets[source] = offsets.get(source, 0) + cut
                partial[source] = data[cut:]
                yield from (f"[{source}] {line}" for line in data[:cut].decode(errors="replace").splitlines())

        def rest() -> Iterator[str]:  # a last line without its newline
            yield from (f"[{s}] {d.decode(errors='replace')}" for s, d in sorted(partial.items()) if d.strip())

        return self.follow_logs(handle, follow, read, self.log_poll, rest)

    def _cancel(self, handle: JobHandle) -> None:
        slurm = self.commands()
        for slurm_id in slurm.ids_named(handle.job_id):
            slurm.scancel(slurm_id)  # scancel of an ended job is a no-op for Slurm

    def _list(self, limit: int) -> builtins.list[JobStatus]:
        """cloudtrain's jobs by Slurm job id (two Slurm jobs of one plan would show twice): those slurmctld holds
        (tagged by --comment), and the ended ones Slurm recorded (named as cloudtrain names jobs, in a job folder)."""
        found: dict[str, JobStatus] = {}
        slurm = self.commands()
        for row in slurm.accounting(since="now-30days"):  # oldest first: a requeued job's later run replaces
            name = row["JobName"]
            if _JOB_NAME.match(name) and row["WorkDir"].endswith(f"/jobs/{name}"):
                found[row["JobID"]] = self._row_status(name, row["State"], row["ExitCode"], row["Submit"])
        for row in slurm.queued():  # what slurmctld holds now wins
            if row["Comment"] == rq.COMMENT:
                found[row["JobID"]] = self._row_status(row["JobName"], row["State"], "0:0", row["Submit"])
        ordered = sorted(found.values(), key=lambda s: s.created_at or 0, reverse=True)
        return ordered[:limit]

    def _row_status(self, name: str, native: str, code: str, submitted: str) -> JobStatus:
        state, message = job_state(native, code)
        return JobStatus(handle=self.handle(name), name=name, state=state, message=message,
                         created_at=_epoch(submitted), details={"slurm_state": native})


def _machine(spec: JobSpec, options: SlurmOptions) -> Machine:
    """Each node as the plan asks Slurm for it (the cluster's machines are its own: no catalog, no price)."""
    where = f"a node of partition {options.partition}" if options.partition else "a node of the default partition"
    asked = [f"{options.cpus_per_node} CPUs" if options.cpus_per_node else "",
             f"{options.memory} memory" if options.memory else "", options.constraint or ""]
    shown = ", ".join(a for a in asked if a)
    return Machine(provider="slurm", instance_type=where + (f" ({shown})" if shown else ""),
                   gpu=spec.accelerator_model, gpus=spec.gpus_per_node, vcpus=options.cpus_per_node or 0)


def _recorded(record: dict[str, Any]) -> dict[str, Any]:
    """What a job folder's job.json says that status may use: it lies on the cluster's shared filesystem, where
    another version or a hand may have left another shape; a value of the wrong type is read as not there (no
    restarts asked for, no checkpoint or output URI), never as a traceback in a watcher."""
    fits = {"max_restarts": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "nodes": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 4096,
            "checkpoint_uri": lambda v: isinstance(v, str), "output_uri": lambda v: isinstance(v, str)}
    return {key: record[key] for key, fit in fits.items() if fit(record.get(key))}


def _warned(slurm: clients.Commands, job_dir: str, nodes: int) -> str:
    """The first warning the job's nodes wrote into their status files (node-<N>.status.json, in the job's folder)."""
    shared = SharedFiles(slurm)
    return warned_message([{"rank": rank, "warnings": shared.read_json(f"{job_dir}/node-{rank}.status.json")
                            .get("warnings")} for rank in range(nodes)])


def _environment(options: SlurmOptions) -> str:
    parts = [f"the nodes' {options.python}"] + ([f"in {options.venv}"] if options.venv else []) + (
        [f"after {len(options.setup)} setup line(s)"] if options.setup else [])
    return " ".join(parts) + " (providers.slurm.python, venv, setup)"


def _epoch(text: str | None) -> float | None:
    """Slurm's local times (2026-01-01T12:00:00) as seconds since the epoch; None for Unknown/None."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None

