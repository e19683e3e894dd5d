"""The toy scheduler's runner: starts each node of one job as a process under the toy node contract (the scheduler's
own variables, its rendezvous on a free port of this machine), writes the job's state, and stops the nodes when the
job is cancelled (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from toyprov import node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(folder: Path) -> str:
    job = json.loads((folder / "job.json").read_text())
    (folder / "runner.pid").write_text(str(os.getpid()))
    (folder / "state").write_text("RUNNING")
    port, count = free_port(), len(job["nodes"])
    procs = []
    for spec in job["nodes"]:
        rank = spec["rank"]
        work = folder / f"node-{rank}"
        work.mkdir(exist_ok=True)
        env = {**os.environ, **spec["env"], **node.emulate(count, rank, port, work, folder.name)[0]}
        with open(folder / f"node-{rank}.log", "ab") as log:
            procs.append(subprocess.Popen(spec["argv"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    cancelled_at = None
    while any(p.poll() is None for p in procs):
        if cancelled_at is None and (folder / "cancel").exists():
            cancelled_at = time.monotonic()
            (folder / "state").write_text("CANCELLING")
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
        if cancelled_at is not None and time.monotonic() - cancelled_at > 20:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        time.sleep(0.1)
    if cancelled_at is not None:
        return "KILLED"
    return "DONE" if all(p.returncode == 0 for p in procs) else "ERROR"


def main() -> None:
    folder = Path(sys.argv[1])
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a cancel's nudge: the loop reads the cancel file
    if (folder / "cancel").exists():
        (folder / "state").write_text("KILLED")
        return
    (folder / "state").write_text(run(folder))


if __name__ == "__main__":
    main()
