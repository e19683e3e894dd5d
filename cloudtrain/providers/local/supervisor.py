"""Runs one local job in the background: starts each node as its own process group, watches them, and records
every change in the job database. Started detached by ``LocalProvider.submit``; survives the CLI that started it.

Stopping follows the cloud's contract: SIGTERM to each node's bootstrap (a container's PID 1), then SIGKILL to
the whole node after the grace period. ``max_runtime`` is enforced as the clouds do (stopped, failed, says why).
Nodes never outlive the supervisor: each holds the read end of a pipe whose write end only this process has, and
its bootstrap stops the node when the pipe reports end-of-file (``cloudtrain/node/watch.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cloudtrain import contract
from cloudtrain.errors import HomeError
from cloudtrain.home import timeline
from cloudtrain.home.paths import cloudtrain_home
from cloudtrain.home.procs import TAG_VAR, kill_tagged, signal_group, start_ticks
from cloudtrain.node.diagnosis import PORT_IN_USE
from cloudtrain.node.durations import format_duration
from cloudtrain.node.watch import GRACE_ENV, SUPERVISOR_FD
from cloudtrain.providers.local import outcome
from cloudtrain.providers.local.jobdb import JobDB, JobRecord
from cloudtrain.providers.local.log_clock import LogClock, node_log
from cloudtrain.providers.local.rendezvous import PORT_RETRIES, contract_env, free_port, naming
from cloudtrain.providers.local.steady_db import RESERVE_NAME, SteadyDB

POLL_SECONDS = 0.2
_ACTIVE = ("pending", "running", "stopping")


class Supervisor:
    def __init__(self, db: JobDB, job_id: str, node_env: dict[str, dict[str, str]] | None = None,
                 node_argv: dict[str, list[str]] | None = None, contract_name: str = "local",
                 submitter: tuple[int, int | None] | None = None) -> None:
        self.db = db
        self.submitter = submitter  # (pid, start ticks) of the submit that started us: we run its claim only
        self.job_id = job_id
        self.node_env = node_env or {}  # unredacted, from the submitter's pipe; never written to disk
        # the nodes' command lines as planned: the record's are masked for display (a secret value that also
        # occurs in a path, demo.py with DB_PASSWORD=demo, would start ****.py)
        self.node_argv = node_argv or {}
        self.contract_name = contract_name  # whose variables name the rendezvous port (to choose it again)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stop: str | None = None  # one of outcome.PREEMPT, CANCEL, MAX_RUNTIME, PEER_FAILED
        self.stop_sent_at: float | None = None
        self.deadline: float | None = None  # max_runtime, over all restarts
        # Held open for our whole life and inherited by no one but the nodes (as a read end): when we die, however,
        # every node's read returns end-of-file.
        self.lifeline, self._lifeline_w = os.pipe()
        self.exited = threading.Event()  # set by a node's waiter thread: watch() looks at once, not a poll later
        self.stop_file: Path | None = None  # where the nodes read why they were stopped, when not preempted
        self.clock: LogClock | None = None  # when each node's log grew (`logs --merge`)

    def request_stop(self, signum: int, _frame: Any) -> None:
        # SIGUSR1 is `cloudtrain preempt` (a rehearsed spot interruption); SIGTERM/SIGINT is a cancel.
        self.stop = self.stop or (outcome.PREEMPT if signum == signal.SIGUSR1 else outcome.CANCEL)

    def start_nodes(self, record: JobRecord, attempt: int, why: str = "") -> list[dict[str, Any]]:
        """Start every node (``why``: the line each node's log gets when they start over)."""
        nodes = []
        self.stop_file = Path(record.job_dir) / "stop-reason"
        self.stop_file.unlink(missing_ok=True)  # an earlier attempt's
        for node in record.plan["nodes"]:
            rank = node["rank"]
            log_path = node_log(Path(record.job_dir), rank)
            status_file = Path(record.job_dir) / f"node-{rank}.status.json"
            status_file.unlink(missing_ok=True)
            tag = f"{self.job_id}/node-{rank}"
            env = {**os.environ, **self.node_env[str(rank)], TAG_VAR: tag, SUPERVISOR_FD: str(self.lifeline),
                   GRACE_ENV: f"{record.grace_period:g}", contract.STOP_REASON_FILE: str(self.stop_file)}
            with open(log_path, "ab") as log:
                if why:
                    log.write(f"[cloudtrain] {why}\n".encode())
                argv = self.node_argv.get(str(rank), node["argv"])
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=record.job_dir, start_new_session=True, pass_fds=(self.lifeline,))
            self.procs[rank] = proc
            threading.Thread(target=self._await, args=(proc,), name=f"node-{rank}-exit", daemon=True).start()
            nodes.append({"rank": rank, "pid": proc.pid, "pgid": proc.pid, "start": start_ticks(proc.pid),
                          "log": str(log_path), "status_file": str(status_file), "exit_code": None, "outcome": None,
                          "tag": tag})
        return nodes

    def _claim(self, ours: dict[str, Any], **changes: Any) -> bool:
        """A change to the pending job made only while the record is still our submitter's (``ours``); one the
        database cannot take now is queued as any other (SteadyDB) and counts as made."""
        try:
            return self.db.update_where(self.job_id, {"state": ("pending",), **ours}, **changes)
        except HomeError:
            return self.db.update(self.job_id, only_if_state=("pending",), **changes)

    def _await(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()  # holds the Popen's wait lock: poll() in watch() reads None until this has reaped the node
        self.exited.set()

    def run(self) -> int:
        record = self.db.get(self.job_id)
        if record is None:
            print(f"no job {self.job_id}", file=sys.stderr)
            return 2
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self.request_stop)
        # Claim the job (the submitter may have died before recording our pid); a job cancelled or ended before we
        # got here stays as it is, and one another submit of the same plan took over (ours was killed before it
        # handed us the nodes' environment) is that submit's supervisor's to run.
        ours = {"submitter_pid": self.submitter[0], "submitter_start": self.submitter[1]} if self.submitter else {}
        if ours and (record.submitter_pid, record.submitter_start) != self.submitter:
            return 0
        if not record.cancel_requested and any(str(n["rank"]) not in self.node_env for n in record.plan["nodes"]):
            self._claim(ours, state="failed", ended_at=time.time(),
                        message="the submitting process ended before handing over the nodes' environment; submit again")
            return 1
        me = os.getpid()
        if record.cancel_requested or not self._claim(ours, supervisor_pid=me, supervisor_start=start_ticks(me)):
            fresh = self.db.get(self.job_id)
            if ours and fresh and (fresh.submitter_pid, fresh.submitter_start) != self.submitter:
                return 0
            self.db.update(self.job_id, state="cancelled", ended_at=time.time(), message="cancelled before start",
                           only_if_state=_ACTIVE)
            return 0
        max_restarts = int(record.plan.get("request", {}).get("max_restarts", 0))
        max_runtime = record.plan.get("spec", {}).get("max_runtime")
        started = time.monotonic()
        self.deadline = started + float(max_runtime) if max_runtime else None
        attempt, port_retries, why = 0, 0, ""
        self.clock = LogClock(Path(record.job_dir), [n["rank"] for n in record.plan["nodes"]])
        while True:
            nodes = self.start_nodes(record, attempt, why)
            timeline.record(f"local://{self.job_id}", "node_started", attempt=attempt, nodes=len(nodes))
            self.db.update(self.job_id, state="running", nodes=nodes, attempt=attempt,
                           message=f"restart {attempt} of {max_restarts}" if attempt else "",
                           only_if_state=_ACTIVE)
            if attempt == 0:
                self.db.update(self.job_id, started_at=time.time())
            self.watch(nodes, record.grace_period)
            fresh = self.db.get(self.job_id)
            state, message = outcome.final_state(
                nodes, cancelled=bool(fresh and fresh.cancel_requested), stop=self.stop, attempt=attempt,
                max_runtime=max_runtime, ran_for=time.monotonic() - started)
            budget = record.plan.get("budget") or {}
            if self.stop == outcome.MAX_RUNTIME and budget.get("runtime_cap") == max_runtime:
                message = (f"budget USD {budget['max_cost']:.2f} spent: {message} (the max_runtime max_cost buys, "
                           "which holds when no watcher stops the job first)")
            if state == "preempted":
                timeline.record(f"local://{self.job_id}", "preempted", attempt=attempt, message=message[:200])
            aside = next((n["set_aside"] for n in nodes if isinstance(n.get("set_aside"), dict)
                          and "step" in n["set_aside"]), None)
            if state == "preempted" and attempt < max_restarts:  # managed-spot emulation: the same job again,
                attempt += 1  # resuming from its checkpoints
                why = f"restart {attempt} after preemption"
            elif state == "failed" and aside and attempt < max_restarts and self.stop in (None, outcome.PEER_FAILED):
                attempt += 1  # the checkpoint it could not load is set aside: the next start takes an older one
                why = f"restart {attempt} after checkpoint {aside['step']} was set aside"
            elif (state == "failed" and self.stop in (None, outcome.PEER_FAILED) and port_retries < PORT_RETRIES
                  and any(n.get("cause") == PORT_IN_USE for n in nodes)):
                port_retries += 1  # nothing ran: the same attempt again, where no other process is
                why = self._new_port(record)
            else:
                break
            self.stop, self.stop_sent_at, self.procs = None, None, {}
        self.db.update(self.job_id, state=state, message=message, ended_at=time.time(), nodes=nodes)
        return 0

    def _new_port(self, record: JobRecord) -> str:
        """Another process took the rendezvous port before node 0's torchrun bound it: the nodes' variables and the
        record's rendezvous name a new one. Returns the line each node's log gets."""
        port = free_port()
        fresh = contract_env(self.contract_name, len(record.plan["nodes"]), port, Path(record.job_dir), self.job_id)
        for rank, env in fresh.items():
            self.node_env[rank] = {**self.node_env.get(rank, {}), **env}
        request = record.plan.setdefault("request", {})
        taken = str(request.get("rendezvous", "")).rpartition(":")[2]
        request["rendezvous"] = naming(str(request.get("rendezvous", "at 127.0.0.1")), port)
        self.db.update(self.job_id, plan=record.plan, only_if_state=_ACTIVE)
        return (f"the rendezvous port {taken or '?'} was taken by another process before torchrun bound it: "
                f"starting the nodes again on port {port}")

    def watch(self, nodes: list[dict[str, Any]], grace: float) -> None:
        """Until every node exited: record exits, stop the rest when one fails, max_runtime passes or a stop was
        asked for."""
        while True:
            for node in nodes:
                proc = self.procs[node["rank"]]
                if node["exit_code"] is None and proc.poll() is not None:
                    node["exit_code"] = proc.returncode
                    outcome.settle_node(node, self.stop)
                    self.db.update(self.job_id, nodes=nodes)
                    if node["outcome"] == "failed" and not self.stop:
                        self.stop = outcome.PEER_FAILED
            if all(n["exit_code"] is not None for n in nodes):
                break
            if not self.stop and self.deadline is not None and time.monotonic() > self.deadline:
                self.stop = outcome.MAX_RUNTIME
            if self.stop and self.stop_sent_at is None:
                self._signal_nodes(nodes)
                self.db.update(self.job_id, state="stopping", message=self._stopping_message(nodes),
                               only_if_state=("running", "pending"))
            elif self.stop_sent_at is not None and time.monotonic() - self.stop_sent_at > grace:
                for node in nodes:
                    if node["exit_code"] is None:
                        signal_group(node["pgid"], signal.SIGKILL)
                        kill_tagged(node["tag"])
            if self.clock:
                self.clock.tick()
            self.exited.wait(POLL_SECONDS)
            self.exited.clear()  # before the next look at every node: an exit from now on wakes the wait after it
        if self.clock:
            self.clock.tick(force=True)  # the nodes' last lines
        for node in nodes:  # workers a node left behind never outlive the job
            signal_group(node["pgid"], signal.SIGKILL)
            kill_tagged(node["tag"])

    def _stopping_message(self, nodes: list[dict[str, Any]]) -> str:
        if self.stop == outcome.PEER_FAILED:
            return f"{self._stop_reason(nodes)}: stopping the others"
        if self.stop == outcome.MAX_RUNTIME:
            return f"{self._stop_reason(nodes)}: stopping"
        return "cancel requested" if self.stop == outcome.CANCEL else "preempted: SIGTERM sent to every node"

    def _stop_reason(self, nodes: list[dict[str, Any]]) -> str:
        """Why the nodes are being stopped, as a stopped node says it ('stopped: node 1 failed')."""
        if self.stop == outcome.PEER_FAILED:
            failed = next((n for n in nodes if n["outcome"] == "failed"), None)
            return f"node {failed['rank'] if failed else '?'} failed"
        if self.stop == outcome.MAX_RUNTIME:
            record = self.db.get(self.job_id)
            limit = record.plan.get("spec", {}).get("max_runtime", 0) if record else 0
            return f"max_runtime {format_duration(limit)} exceeded"
        return "cancelled by user" if self.stop == outcome.CANCEL else "preempted"

    def _signal_nodes(self, nodes: list[dict[str, Any]]) -> None:
        self.stop_sent_at = time.monotonic()
        if self.stop != outcome.PREEMPT and self.stop_file is not None:  # else each node reports "preempted"
            with contextlib.suppress(OSError):
                self.stop_file.write_text(self._stop_reason(nodes) + "\n")
        for node in nodes:
            if node["exit_code"] is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node["pid"], signal.SIGTERM)  # the bootstrap forwards it to torchrun


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m cloudtrain.providers.local.supervisor JOB_ID [SUBMITTER_PID:START]", file=sys.stderr)
        return 2
    submitter = None
    if len(args) == 2:  # the submit that started us, as the record names it
        pid, _, ticks = args[1].partition(":")
        submitter = (int(pid), int(ticks) if ticks else None)
    home = cloudtrain_home()
    # a full disk or a long-held lock does not kill the supervisor: see steady_db
    db = SteadyDB(home / "jobs.db", reserve=home / "jobs" / args[0] / RESERVE_NAME)
    try:
        handed = json.loads(sys.stdin.read() or "{}")
    except ValueError:  # cut short: the submitter died while writing it
        handed = {}
    try:
        return Supervisor(db, args[0], handed.get("env", {}), handed.get("argv", {}),
                          handed.get("contract", "local"), submitter).run()
    finally:
        db.settle()


if __name__ == "__main__":
    sys.exit(main())
