"""Local provider: the cloud path with processes instead of VMs.

submit = stage the bundle in the local object store (content-addressed), record the job in SQLite, and start a
detached supervisor that launches each node as ``python bootstrap.py ...`` exactly as a cloud node would.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cloudtrain import contract, registry, storage
from cloudtrain.contract import FORCE_CPU, METADATA_URL
from cloudtrain.errors import HandleError, HomeError, SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.home.errors import os_problem
from cloudtrain.home.paths import cloudtrain_home, default_store_uri
from cloudtrain.home.procs import is_alive, kill_tagged, signal_group, start_ticks, tag_alive
from cloudtrain.job_types import Capability, JobState, JobStatus, NodeCommand, Summary
from cloudtrain.providers.base import Provider
from cloudtrain.providers.local import PROVIDER, outcome
from cloudtrain.providers.local.jobdb import JobDB, JobRecord
from cloudtrain.providers.local.log_clock import merged, node_log
from cloudtrain.providers.local.rendezvous import contract_env, free_port, naming
from cloudtrain.providers.translation import Planned, Translation

if TYPE_CHECKING:
    from cloudtrain.providers.translation import PlanContext
    from cloudtrain.spec.model import JobSpec

_ACTIVE = ("pending", "running", "stopping")
PORT_AT_SUBMIT = 0  # in a plan's node variables: the rendezvous port, which submit chooses
START_TIMEOUT = 120.0  # seconds a submitted job may wait for a supervisor before it is declared never started
CLAIM_SECONDS = 10.0  # after its submitter ended: how long its supervisor may take to claim the job
LOST_MARGIN = 30.0  # beyond the grace period: how long nodes may take to stop after their supervisor is gone


def plan_summary(plan: Planned) -> Summary:
    """The plan summary's local line: every node is this machine."""
    return Summary(instance="this machine")


class LocalProvider(Provider):
    declaration = PROVIDER
    capabilities = frozenset({Capability.MULTI_NODE, Capability.SPOT, Capability.ACCELERATORS, Capability.PREEMPT})
    poll_seconds = 0.2  # a local job's status is a file read

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or cloudtrain_home()
        self.db = JobDB(self.home / "jobs.db")

    # -- plan ------------------------------------------------------------------------------------------
    def contract(self, spec: JobSpec) -> registry.Declaration:
        """cloudtrain's own node contract, or with ``emulate`` the platform's whose nodes these imitate."""
        emulate = spec.providers.local.emulate
        found = registry.by_platform(emulate) if emulate else None
        return found or self.declaration

    def _translate(self, ctx: PlanContext) -> Translation:
        """Pure: the rendezvous port is chosen at submit (the plan shows where), nothing is written or bound."""
        # what only planning needs (the spec's models, packaging) is imported here: status, logs, list and cancel, a
        # CLI call each, never load it
        from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME
        from cloudtrain.bundle.staging import bundle_prefix, default_output_uri, new_job_id
        from cloudtrain.platforms.images import this_machine, this_python
        from cloudtrain.platforms.node_commands import bootstrap_args, job_env, node_command

        spec, package = ctx.spec, ctx.package
        assert spec.name
        if spec.checkpoint.dir and Path(spec.checkpoint.dir).is_absolute() and spec.nodes > 1:
            raise SpecError(f"checkpoint.dir {spec.checkpoint.dir} is absolute: the {spec.nodes} nodes of a local job "
                            "share this machine, so they would write into one folder", field="checkpoint.dir",
                            remedy="give a folder relative to the script's working folder (each node has its own), "
                                   "e.g. --checkpoint-dir checkpoints")
        job_id = new_job_id(spec.name)
        store = spec.providers.local.store_uri or default_store_uri()
        if not spec.output_uri:  # as on a cloud: each job's outputs in their own folder of the store
            spec = spec.model_copy(update={"output_uri": default_output_uri(store, job_id)})
        prefix = bundle_prefix(store, package)
        bundle_uri = storage.join(prefix, BUNDLE_NAME)
        bootstrap_path = str(storage.local_path(storage.join(prefix, BOOTSTRAP_NAME)))
        job_dir = self.home / "jobs" / job_id
        contract = self.contract(spec)
        module = registry.node_contract(contract.name)
        gpus = visible_gpus()
        nproc = self.processes(spec, gpus)  # this machine is every node's machine
        check_gpu_layout(spec, gpus, nproc or 1)
        files: dict[str, dict[str, str]] = {}
        envs: dict[int, dict[str, str]] = {}
        for rank in range(spec.nodes):
            emulated, node_files = module.emulate(spec.nodes, rank, PORT_AT_SUBMIT, job_dir / f"node-{rank}", job_id)
            files.update({str(rank): node_files} if node_files else {})
            envs[rank] = {**shared_cores_env(spec.nodes), **job_env(spec), **emulated}
            if contract.name != "local":  # an emulated cloud node polls no real metadata server, unless told to
                envs[rank].setdefault(METADATA_URL, "off")
        args_of = {rank: bootstrap_args(spec, bundle=bundle_uri, digest=package.digest,
                                        workdir=str(job_dir / f"node-{rank}"), job_id=job_id,
                                        contract=contract.node_path(), nproc=nproc,
                                        status_file=str(job_dir / f"node-{rank}.status.json"))
                   for rank in range(spec.nodes)}
        nodes = [_shown_port(node_command(rank, this_python(), bootstrap_path, args_of[rank], envs[rank],
                                          {**module.planned(spec.nodes, rank, job_id, ""), **envs[rank]}, module,
                                          job_id)) for rank in range(spec.nodes)]
        procs = nodes[0].nproc_per_node
        request = {
            "job_id": job_id,
            "name": spec.name,
            "nodes": spec.nodes,
            "procs_per_node": procs or "one per GPU",
            "world_size": spec.nodes * procs if procs else None,
            "backend": "gloo (nccl where the node has GPUs)",
            "rendezvous": f"{'c10d' if contract.name == 'local' else 'static'} at 127.0.0.1, on a free port chosen "
                          "at submit",
            "job_dir": str(job_dir),
            "grace_period": spec.providers.local.grace_period,
            "max_restarts": spec.max_restarts,
            "emulate": None if contract.name == "local" else contract.platform_name,
            "node_files": files,
        }
        notes = [note] if (note := crowded_note(spec.nodes, procs)) else []
        if spec.spot:
            notes.append("local: spot is emulated; a preempted job is restarted up to max_restarts times")
        return Translation(job_id=job_id, spec=spec, request=request, nodes=nodes,
                           staging={"prefix": prefix, "bundle": bundle_uri, "store": store}, notes=notes,
                           runtime=this_machine())

    # -- submit ----------------------------------------------------------------------------------------
    def _submit(self, plan: Planned) -> JobHandle:
        from cloudtrain.bundle.staging import stage_bundle

        handle = self.handle(plan.job_id)
        found = self.db.get(plan.job_id)
        if found is not None and not self._take_over(found):
            return handle  # the same plan submitted twice is one job
        stage_bundle(plan.package, plan.staging["prefix"])
        job_dir = Path(plan.request["job_dir"])
        created = not job_dir.exists()
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            for node_files in plan.request.get("node_files", {}).values():
                for path, content in node_files.items():
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                    Path(path).write_text(content)
        except OSError as exc:  # a full or read-only home
            self._unmake(plan.job_id, job_dir, created)
            raise os_problem(exc, job_dir, "write the job's folder") from None
        # The rendezvous port, chosen now (a plan binds nothing): each node's contract variables name it.
        port, contract_name = free_port(), self.contract(plan.spec).name
        emulated = contract_env(contract_name, plan.spec.nodes, port, job_dir, plan.job_id)
        node_env = {str(n.rank): {**n.env, **emulated[str(n.rank)]} for n in plan.nodes}
        # The record on disk is the redacted plan; the real environment reaches the supervisor through a pipe.
        recorded = plan.to_dict()
        recorded["request"]["rendezvous"] = naming(recorded["request"]["rendezvous"], port)
        me = os.getpid()
        record = JobRecord(id=plan.job_id, name=str(plan.spec.name), state="pending", job_dir=str(job_dir),
                           grace_period=float(plan.request["grace_period"]), plan=recorded, submitter_pid=me,
                           submitter_start=start_ticks(me))
        try:
            inserted = self.db.insert(record) if found is None else \
                self.db.update_where(plan.job_id, {"submitter_pid": me}, plan=recorded)
        except HomeError:  # not recorded (locked, full, read-only): nothing of the job stays
            self._unmake(plan.job_id, job_dir, created)
            raise
        if not inserted:
            return handle
        self._start_supervisor(plan.job_id, job_dir, {"env": node_env, "contract": contract_name,
                                                      "argv": {str(n.rank): n.argv for n in plan.nodes}})
        return handle

    def _take_over(self, found: JobRecord) -> bool:
        """Whether this submit starts a job the same plan recorded before that nothing started or will start: its
        submitter was killed between recording it and starting its supervisor (or the supervisor died before any
        node ran). Claimed in one statement, so of two such submits one starts it (and a supervisor the killed
        submitter left, which claims only for its own submitter, stands aside); while the first submitter lives,
        it is left to start it."""
        settled = self._reconcile(found)
        me = os.getpid()
        mine = {"submitter_pid": me, "submitter_start": start_ticks(me), "created_at": time.time()}
        if settled.state == "pending" and settled.supervisor_pid is None and settled.submitter_pid is not None \
                and not is_alive(settled.submitter_pid, settled.submitter_start):
            return self.db.update_where(settled.id, {"state": "pending", "supervisor_pid": None, "submitter_pid":
                                                     settled.submitter_pid, "submitter_start": settled.submitter_start},
                                        **mine)
        if settled.state != "failed" or settled.started_at is not None or settled.cancel_requested \
                or any(n.get("pid") for n in settled.nodes):
            return False
        return self.db.update_where(settled.id, {"state": "failed", "started_at": None, "cancel_requested": 0},
                                    state="pending", message="", ended_at=None, supervisor_pid=None,
                                    supervisor_start=None, lost_at=None, nodes=[], **mine)

    def _unmake(self, job_id: str, job_dir: Path, created: bool) -> None:
        """Remove the folder a failed submit made, unless the same plan submitted elsewhere recorded the job."""
        with contextlib.suppress(HomeError):
            if self.db.get(job_id) is not None:
                return
        if created:
            shutil.rmtree(job_dir, ignore_errors=True)

    def _start_supervisor(self, job_id: str, job_dir: Path, handed: dict[str, Any]) -> None:
        """Start the job's supervisor and hand it, through a pipe, what the record on disk must not hold as it is:
        each node's environment (secrets) and command line (the record's is masked for display)."""
        env = dict(os.environ)
        env[contract.HOME] = str(self.home)
        # The supervisor imports this very cloudtrain, installed or not.
        package_parent = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        try:
            with open(job_dir / "supervisor.log", "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "cloudtrain.providers.local.supervisor", job_id,
                     f"{os.getpid()}:{start_ticks(os.getpid()) or ''}"],
                    env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, close_fds=True,
                )
        except OSError as exc:  # nothing runs: say so now rather than leave the job pending
            self.db.update(job_id, state="failed", message=f"its supervisor could not start: {exc}",
                           ended_at=time.time(), only_if_state=_ACTIVE)
            raise UserError(f"the local supervisor for {job_id} could not start: {exc}") from exc
        with contextlib.suppress(HomeError):  # it runs: it records its own pid when it claims the job
            self.db.update(job_id, supervisor_pid=proc.pid, supervisor_start=start_ticks(proc.pid))
        assert proc.stdin is not None
        try:
            with proc.stdin:
                proc.stdin.write(json.dumps(handed).encode())
        except BrokenPipeError:  # it died at once; status reads its log and ends the job
            pass

    # -- describe / list -------------------------------------------------------------------------------
    def _record(self, handle: JobHandle) -> JobRecord:
        record = self.db.get(handle.job_id)
        if record is None:
            aside = sorted(p for p in self.db.path.parent.glob(f"{self.db.path.name}.corrupt-*")
                           if not p.name.endswith(("-wal", "-shm")))
            raise HandleError(f"no local job {handle.job_id!r} in {self.db.path}",
                              remedy="`cloudtrain list --provider local` shows the known jobs" + (
                                  f"; a corrupt job database set aside as {aside[-1]} may have held it" if aside
                                  else ""))
        return self._reconcile(record)

    def _reconcile(self, record: JobRecord) -> JobRecord:
        """Every job reaches an end, even when its supervisor does not record it: a supervisor that never started,
        or was killed (its nodes then stop on their own; their status files say how they ended)."""
        if record.state not in _ACTIVE:
            return record
        if record.supervisor_pid is None:
            wait = START_TIMEOUT if record.submitter_pid is None else CLAIM_SECONDS  # a record of an older version
            if is_alive(record.submitter_pid, record.submitter_start) or time.time() - record.created_at < wait:
                return record  # the submitter is starting it, or the supervisor it started is claiming it
        elif is_alive(record.supervisor_pid, record.supervisor_start):
            return record
        fresh = self.db.get(record.id)  # it may have finished, or recorded its pid, between our two reads
        if fresh is None or fresh.state not in _ACTIVE or (fresh.supervisor_pid != record.supervisor_pid
                                                           and is_alive(fresh.supervisor_pid, fresh.supervisor_start)):
            return fresh or record
        ranks = [int(n["rank"]) for n in fresh.plan.get("nodes", [])]
        running = [r for r in ranks if tag_alive(f"{fresh.id}/node-{r}")]
        lost_for = time.time() - (fresh.lost_at or time.time())
        if running and lost_for <= fresh.grace_period + LOST_MARGIN:
            # they saw the supervisor go and stop within a grace period; then their status files say how they ended
            self.db.update(fresh.id, state="stopping", lost_at=fresh.lost_at or time.time(), only_if_state=_ACTIVE,
                           message=f"its supervisor is gone: {len(running)} node(s) stopping on their own")
            return self.db.get(fresh.id) or fresh
        for rank in running:  # a node that does not watch its supervisor (a bundle without cloudtrain's lib/)
            signal_group(next((n.get("pgid") for n in fresh.nodes if n["rank"] == rank), None), signal.SIGKILL)
            kill_tagged(f"{fresh.id}/node-{rank}")
        state, message = self._ended_without_supervisor(fresh, ranks)
        self.db.update(fresh.id, state=state, message=message, ended_at=time.time(), nodes=fresh.nodes,
                       only_if_state=_ACTIVE)
        return self.db.get(fresh.id) or fresh

    def _ended_without_supervisor(self, record: JobRecord, ranks: list[int]) -> tuple[str, str]:
        """How a job ended whose supervisor is gone and whose nodes all exited: from the nodes' status files."""
        if record.supervisor_pid is None:
            return ("cancelled", "cancelled before start") if record.cancel_requested else (
                "failed", "its supervisor never started (the submitting command was interrupted?): submit again")
        job_dir = Path(record.job_dir)
        known = {int(n["rank"]): n for n in record.nodes}
        record.nodes = [known.get(r) or {"rank": r, "exit_code": None, "status_file": str(
            job_dir / f"node-{r}.status.json")} for r in ranks]
        for node in record.nodes:
            if node.get("outcome") is None:
                outcome.settle_node(node, outcome.CANCEL if record.cancel_requested else None)
        reported = [n for n in record.nodes if outcome.read_status(n.get("status_file"))]
        if not known and not reported and record.cancel_requested:  # stopped by the cancel before any node started
            return "cancelled", "cancelled before its nodes started"
        if not known and not reported:
            return "failed", "its supervisor exited before starting the nodes" + _last_line(job_dir / "supervisor.log")
        if not reported and not record.cancel_requested:
            return "failed", "the job's processes vanished (supervisor and nodes killed, or machine restarted)"
        return outcome.final_state(record.nodes, cancelled=bool(record.cancel_requested), stop=None,
                                   attempt=record.attempt)

    def _status(self, record: JobRecord) -> JobStatus:
        nodes = [{**{k: n.get(k) for k in ("rank", "pid", "exit_code", "outcome", "log", "tag")},
                  **{k: n[k] for k in outcome.NODE_FIELDS if k in n}} for n in record.nodes]
        plan = record.plan.get("request", {})
        spec = record.plan.get("spec", {})
        return JobStatus(
            handle=self.handle(record.id), name=record.name, state=JobState(record.state),
            message=record.message, created_at=record.created_at, started_at=record.started_at,
            ended_at=record.ended_at, details={"world_size": plan.get("world_size"), "job_dir": record.job_dir},
            nodes=nodes, restarts=record.attempt, max_restarts=plan.get("max_restarts", 0),
            output_uri=spec.get("output_uri"), checkpoint_uri=(spec.get("checkpoint") or {}).get("uri"),
            # the supervisor's own time: its first start of the nodes (a restart's is its node_started event's)
            state_since=record.started_at if record.state == "running" and not record.attempt else None,
        )

    def _describe(self, handle: JobHandle) -> JobStatus:
        return self._status(self._record(handle))

    def _list(self, limit: int) -> list[JobStatus]:
        return [self._status(self._reconcile(r)) for r in self.db.list(limit)]

    # -- cancel ----------------------------------------------------------------------------------------
    def _cancel(self, handle: JobHandle) -> None:
        record = self._record(handle)
        self.db.update(record.id, cancel_requested=1)
        if record.supervisor_pid is None:  # not started (yet): a supervisor that starts later sees the cancel
            self.db.update(record.id, state="cancelled", message="cancelled before start", ended_at=time.time(),
                           only_if_state=("pending",))
            return
        self.db.update(record.id, state="stopping", message="cancel requested", only_if_state=("pending", "running"))
        if record.state in _ACTIVE and is_alive(record.supervisor_pid, record.supervisor_start):
            os.kill(record.supervisor_pid, signal.SIGTERM)
        else:
            self._reconcile(self.db.get(record.id) or record)

    def _preempt(self, handle: JobHandle) -> JobStatus:
        """Every node gets SIGTERM as from the platform, through the job's supervisor."""
        record = self._record(handle)
        if record.state != "running" or not is_alive(record.supervisor_pid, record.supervisor_start):
            raise UserError(f"{handle} is {record.state}; only a running job can be preempted")
        assert record.supervisor_pid
        os.kill(record.supervisor_pid, signal.SIGUSR1)
        deadline = time.monotonic() + 5  # until the supervisor has signalled the nodes (it polls every 0.2 s)
        while record.state == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            record = self.db.get(record.id) or record
        return self._status(record)

    # -- logs ------------------------------------------------------------------------------------------
    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]:
        record = self._record(handle)
        job_dir = Path(record.job_dir)
        ranks = [n["rank"] for n in record.plan.get("nodes", [])]
        files: dict[int, IO[str]] = {}
        pending: dict[int, str] = {r: "" for r in ranks}

        def read() -> Iterator[str]:
            for rank in ranks:
                if rank not in files:
                    path = node_log(job_dir, rank)
                    if not path.exists():
                        continue
                    files[rank] = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
                chunk = files[rank].read()
                if chunk:
                    lines = (pending[rank] + chunk).split("\n")
                    pending[rank] = lines.pop()
                    yield from (f"[node{rank}] {line}" for line in lines)

        ended = _SupervisorExit(record)
        try:
            yield from self.follow_logs(handle, follow, read, 0.2, pause=ended.wait,
                                        rest=lambda: (f"[node{r}] {pending[r]}" for r in ranks if pending[r]))
        finally:
            ended.close()
            for f in files.values():
                f.close()


    def merged_logs(self, handle: JobHandle) -> Iterator[str]:
        """Every node's lines ordered by time (`logs --merge`): when the supervisor's clock saw each written."""
        record = self._record(self._own(handle))
        return merged(Path(record.job_dir), [n["rank"] for n in record.plan.get("nodes", [])])


class _SupervisorExit:
    """A follower's wait between two log reads, cut short when the job's supervisor exits (it records the job's end
    just before): a foreground local job ends with its job, not up to a poll later. A plain sleep where the OS has
    no pidfd, for a supervisor not running (or not started yet), and once it has exited."""

    def __init__(self, record: JobRecord) -> None:
        self.fd: int | None = None
        pid = record.supervisor_pid
        if pid and hasattr(os, "pidfd_open") and is_alive(pid, record.supervisor_start):
            with contextlib.suppress(OSError):
                self.fd = os.pidfd_open(pid)

    def wait(self, seconds: float) -> None:
        if self.fd is None:
            time.sleep(seconds)
        elif select.select([self.fd], [], [], seconds)[0]:
            self.close()  # it exited: readable from now on, so later waits sleep

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def check_gpu_layout(spec: JobSpec, gpus: int, procs: int) -> None:
    """Every node of a local job runs on this machine, each rank on GPU ``LOCAL_RANK``: more ranks than GPUs would put
    two on one device, which NCCL refuses (``invalid device ordinal``, ``Duplicate GPU detected``) after the job
    started. Refused here instead, naming both numbers. A machine without GPUs, or a job told to use the CPU
    (CLOUDTRAIN_FORCE_CPU=1), rehearses any layout with gloo."""
    if not gpus or spec.env.get(FORCE_CPU) == "1":
        return
    ranks = spec.nodes * procs
    if procs > gpus:
        raise SpecError(f"{procs} processes per node, but this machine has {gpus} GPU(s): each process takes one",
                        field="procs_per_node",
                        remedy=f"set procs_per_node to at most {gpus} (or 'auto': one per GPU); to rehearse the layout "
                               f"on the CPU with gloo, add --env {FORCE_CPU}=1")
    if ranks > gpus:
        raise SpecError(f"{spec.nodes} nodes x {procs} processes = {ranks} ranks, but the nodes of a local job share "
                        f"this machine's {gpus} GPU(s): each rank takes one", field="nodes",
                        remedy=f"use at most {gpus} ranks in all (nodes x procs_per_node); to rehearse the layout on "
                               f"the CPU with gloo, add --env {FORCE_CPU}=1")


def shared_cores_env(nodes: int) -> dict[str, str]:
    """A worker's environment as bare torchrun leaves it (torchrun sets OMP_NUM_THREADS=1 itself where a node runs
    several processes, and leaves it unset for one), except where several nodes share this machine's cores: each
    node's torchrun would then let its one worker take every core. The spec's env and the user's own win."""
    if nodes <= 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": "1"}


def visible_gpus() -> int:
    """This machine's GPUs, counted as a node counts its own (cloudtrain/node/launch.py: CUDA_VISIBLE_DEVICES, else
    the driver's device list), without importing torch."""
    from cloudtrain.node.launch import visible_gpus as counted

    return counted(dict(os.environ))


def crowded_note(nodes: int, procs: int, cpus: int | None = None) -> str | None:
    """A plan note when a local job's processes (every node runs on this machine) are far more than its CPUs: it
    runs, each process on a sliver of a core, and only the note says why it crawls. Up to twice the CPUs is the
    usual rehearsal of a layout (2 x 2 on a laptop) and goes without saying."""
    if cpus is None:  # the CPUs this process may run on (a container's or taskset's share), not the machine's
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    total = nodes * procs
    if total <= 2 * cpus:
        return None
    return (f"local: {total} processes ({nodes} node(s) x {procs}) on this machine's {cpus} CPU(s), {total / cpus:.0f} "
            "per CPU: it runs, slowly (start-up and every collective wait on the crowded cores); fine to rehearse the "
            "layout, for training use fewer --procs-per-node here or a cloud provider")


def _shown_port(node: NodeCommand) -> NodeCommand:
    """A plan's node line with the rendezvous port as what it is: chosen at submit."""
    line = [a.replace(f":{PORT_AT_SUBMIT}", ":<port>") if a.endswith(f":{PORT_AT_SUBMIT}") else a
            for a in node.torchrun]
    if "--master-port" in line:
        line[line.index("--master-port") + 1] = "<port>"
    return replace(node, torchrun=line)


def _last_line(log: Path) -> str:
    """': <the last line of a log>' (what a crashed process said last), or '' when there is none."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:300]} (see {log})" if lines else ""
