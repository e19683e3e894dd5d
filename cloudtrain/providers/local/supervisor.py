"""Runs one local job in the background: starts each node as its own process group, watches them, and records
every change in the job database. Started detached by ``LocalProvider.submit``; survives the CLI that started it.

Stopping follows the cloud's contract: SIGTERM to each node's bootstrap (a container's PID 1), then SIGKILL to
the whole node after the grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cloudtrain.home import cloudtrain_home
from cloudtrain.providers.local.jobdb import JobDB, JobRecord
from cloudtrain.providers.local.procs import TAG_VAR, kill_tagged, signal_group, start_ticks

POLL_SECONDS = 0.2


class Supervisor:
    def __init__(self, db: JobDB, job_id: str, node_env: dict[str, dict[str, str]] | None = None) -> None:
        self.db = db
        self.job_id = job_id
        self.node_env = node_env or {}  # unredacted, from the submitter's pipe; never written to disk
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stop_reason: str | None = None
        self.stop_sent_at: float | None = None

    def request_stop(self, signum: int, _frame: Any) -> None:
        # SIGUSR1 is `cloudtrain preempt` (a rehearsed spot interruption); SIGTERM/SIGINT is a cancel.
        reason = "preempted" if signum == signal.SIGUSR1 else "cancelled"
        self.stop_reason = self.stop_reason or reason

    def start_nodes(self, record: JobRecord, attempt: int) -> list[dict[str, Any]]:
        nodes = []
        for node in record.plan["nodes"]:
            rank = node["rank"]
            log_path = Path(record.job_dir) / f"node-{rank}.log"
            status_file = Path(record.job_dir) / f"node-{rank}.status.json"
            status_file.unlink(missing_ok=True)
            tag = f"{self.job_id}/node-{rank}"
            env = {**os.environ, **self.node_env.get(str(rank), node["env"]), TAG_VAR: tag}
            with open(log_path, "ab") as log:
                if attempt:
                    log.write(f"[cloudtrain] restart {attempt} after preemption\n".encode())
                proc = subprocess.Popen(node["argv"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=record.job_dir, start_new_session=True)
            self.procs[rank] = proc
            nodes.append({"rank": rank, "pid": proc.pid, "pgid": proc.pid, "start": start_ticks(proc.pid),
                          "log": str(log_path), "status_file": str(status_file), "exit_code": None, "outcome": None,
                          "tag": tag})
        return nodes

    def run(self) -> int:
        record = self.db.get(self.job_id)
        if record is None:
            print(f"no job {self.job_id}", file=sys.stderr)
            return 2
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self.request_stop)
        if record.cancel_requested:
            self.db.update(self.job_id, state="cancelled", ended_at=time.time(), message="cancelled before start")
            return 0
        max_restarts = int(record.plan.get("request", {}).get("max_restarts", 0))
        attempt = 0
        while True:
            nodes = self.start_nodes(record, attempt)
            self.db.update(self.job_id, state="running", nodes=nodes, attempt=attempt,
                           message=f"restart {attempt} of {max_restarts}" if attempt else "",
                           only_if_state=("pending", "running", "stopping"))
            if attempt == 0:
                self.db.update(self.job_id, started_at=time.time())
            self.watch(nodes, record.grace_period)
            state, message = self._final_state(nodes)
            if state == "preempted" and attempt < max_restarts:
                attempt += 1
                self.stop_reason, self.stop_sent_at, self.procs = None, None, {}
                continue  # managed-spot emulation: the same job again, resuming from its checkpoints
            break
        self.db.update(self.job_id, state=state, message=message, ended_at=time.time(), nodes=nodes)
        return 0

    def watch(self, nodes: list[dict[str, Any]], grace: float) -> None:
        """Until every node exited: record exits, stop the rest when one fails or a stop was asked for."""
        while True:
            for node in nodes:
                proc = self.procs[node["rank"]]
                if node["exit_code"] is None and proc.poll() is not None:
                    node["exit_code"] = proc.returncode
                    node["outcome"] = self._outcome(node)
                    self.db.update(self.job_id, nodes=nodes)
                    if node["outcome"] == "failed" and not self.stop_reason:
                        self.stop_reason = f"node {node['rank']} failed"
            if all(n["exit_code"] is not None for n in nodes):
                break
            if self.stop_reason and self.stop_sent_at is None:
                self._signal_nodes(nodes)
                self.db.update(self.job_id, state="stopping", message=self.stop_reason,
                               only_if_state=("running", "pending"))
            elif self.stop_sent_at is not None and time.monotonic() - self.stop_sent_at > grace:
                for node in nodes:
                    if node["exit_code"] is None:
                        signal_group(node["pgid"], signal.SIGKILL)
                        kill_tagged(node["tag"])
            time.sleep(POLL_SECONDS)
        for node in nodes:  # workers a node left behind never outlive the job
            signal_group(node["pgid"], signal.SIGKILL)
            kill_tagged(node["tag"])

    def _signal_nodes(self, nodes: list[dict[str, Any]]) -> None:
        self.stop_sent_at = time.monotonic()
        for node in nodes:
            if node["exit_code"] is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node["pid"], signal.SIGTERM)  # the bootstrap forwards it to torchrun

    def _outcome(self, node: dict[str, Any]) -> str:
        try:
            return str(json.loads(Path(node["status_file"]).read_text())["outcome"])
        except (OSError, ValueError, KeyError):  # the node died before it could say: judge by what we did to it
            if node["exit_code"] == 0:
                return "succeeded"
            return "preempted" if self.stop_sent_at is not None and self.stop_reason == "preempted" else "failed"

    def _final_state(self, nodes: list[dict[str, Any]]) -> tuple[str, str]:
        record = self.db.get(self.job_id)
        if record is not None and record.cancel_requested:
            return "cancelled", "cancelled by user"
        failed = [n for n in nodes if n["outcome"] == "failed"]
        if failed:
            first = failed[0]
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # the reason the bootstrap gave
                error = json.loads(Path(first["status_file"]).read_text())["error"]
                return "failed", f"node {first['rank']} failed: {error}"
            return "failed", f"node {first['rank']} failed with exit code {first['exit_code']} (see its log)"
        if any(n["outcome"] == "preempted" for n in nodes):
            return "preempted", f"preempted (SIGTERM) after {record.attempt if record else 0} restart(s)"
        return "succeeded", ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cloudtrain.providers.local.supervisor JOB_ID", file=sys.stderr)
        return 2
    db = JobDB(cloudtrain_home() / "jobs.db")
    node_env = json.loads(sys.stdin.read() or "{}")
    return Supervisor(db, args[0], node_env).run()


if __name__ == "__main__":
    sys.exit(main())
