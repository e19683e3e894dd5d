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
from cloudtrain.providers.local.procs import signal_group, start_ticks

POLL_SECONDS = 0.2


class Supervisor:
    def __init__(self, db: JobDB, job_id: str) -> None:
        self.db = db
        self.job_id = job_id
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stop_reason: str | None = None
        self.stop_sent_at: float | None = None

    def request_stop(self, signum: int, _frame: Any) -> None:
        self.stop_reason = self.stop_reason or "cancelled"

    def start_nodes(self, record: JobRecord) -> list[dict[str, Any]]:
        nodes = []
        for node in record.plan["nodes"]:
            rank = node["rank"]
            log_path = Path(record.job_dir) / f"node-{rank}.log"
            env = {**os.environ, **node["env"]}
            env.pop("CLOUDTRAIN_SUPERVISOR", None)
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(node["argv"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=record.job_dir, start_new_session=True)
            self.procs[rank] = proc
            nodes.append({"rank": rank, "pid": proc.pid, "pgid": proc.pid, "start": start_ticks(proc.pid),
                          "log": str(log_path), "status_file": str(Path(record.job_dir) / f"node-{rank}.status.json"),
                          "exit_code": None, "outcome": None})
        return nodes

    def run(self) -> int:
        record = self.db.get(self.job_id)
        if record is None:
            print(f"no job {self.job_id}", file=sys.stderr)
            return 2
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        if record.cancel_requested:
            self.db.update(self.job_id, state="cancelled", ended_at=time.time(), message="cancelled before start")
            return 0
        nodes = self.start_nodes(record)
        self.db.update(self.job_id, state="running", started_at=time.time(), nodes=nodes,
                       only_if_state=("pending",))
        grace = record.grace_period
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
            time.sleep(POLL_SECONDS)
        for node in nodes:  # workers a node left behind never outlive the job
            signal_group(node["pgid"], signal.SIGKILL)
        state, message = self._final_state(nodes)
        self.db.update(self.job_id, state=state, message=message, ended_at=time.time(), nodes=nodes)
        return 0

    def _signal_nodes(self, nodes: list[dict[str, Any]]) -> None:
        self.stop_sent_at = time.monotonic()
        for node in nodes:
            if node["exit_code"] is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node["pid"], signal.SIGTERM)  # the bootstrap forwards it to torchrun

    @staticmethod
    def _outcome(node: dict[str, Any]) -> str:
        try:
            return str(json.loads(Path(node["status_file"]).read_text())["outcome"])
        except (OSError, ValueError, KeyError):
            return "succeeded" if node["exit_code"] == 0 else "failed"

    def _final_state(self, nodes: list[dict[str, Any]]) -> tuple[str, str]:
        record = self.db.get(self.job_id)
        if record is not None and record.cancel_requested:
            return "cancelled", "cancelled by user"
        failed = [n for n in nodes if n["outcome"] == "failed"]
        if failed:
            first = failed[0]
            return "failed", f"node {first['rank']} failed with exit code {first['exit_code']} (see its log)"
        if any(n["outcome"] == "preempted" for n in nodes):
            return "preempted", "stopped by SIGTERM"
        return "succeeded", ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cloudtrain.providers.local.supervisor JOB_ID", file=sys.stderr)
        return 2
    db = JobDB(cloudtrain_home() / "jobs.db")
    return Supervisor(db, args[0]).run()


if __name__ == "__main__":
    sys.exit(main())
