"""torchrun, run by the node's bootstrap with SIGTERM/SIGINT forwarded to it, its stderr shown as the node shows it.
Standard library only, Python 3.8 (the node entry, cloudtrain/node/entry.py, runs it from the bundle's lib/)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any


def run(argv: list[str], cwd: Path, env: dict[str, str], early: list[int] | None = None) -> tuple[int, bool]:
    """Run torchrun, forwarding SIGTERM/SIGINT to it. Returns (exit code, whether we were asked to stop).
    ``early``: signals that arrived before the forwarding handler was installed; they are forwarded at once."""
    stderr = launcher_stderr(argv)
    child = subprocess.Popen(argv, cwd=cwd, env=env, stderr=None if stderr is None else subprocess.PIPE)
    if stderr is not None:
        stderr.start(child.stderr)
    stopping = {"signal": None}

    def forward(signum: int, _frame: object) -> None:
        stopping["signal"] = signum  # type: ignore[assignment]
        if stderr is not None:
            stderr.stopping()  # before torchrun can print the traceback this signal gives it
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    code: int | None = None
    if early:  # a stop that landed between the last check and the handler above: not lost
        forward(early[-1], None)
    try:
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for old Pythons
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if stderr is not None:
            stderr.finish(code)  # what it held decided by how torchrun ended: its teardown's noise, or its failure
    assert code is not None
    return code, stopping["signal"] is not None


def launcher_stderr(argv: list[str]) -> Any:
    """torchrun's stderr as the node shows it (cloudtrain/node/launcher_stderr.py); None (torchrun writes to the node's
    stderr itself) without a ``--log-dir``."""
    from cloudtrain.node.launcher_stderr import LauncherStderr

    return LauncherStderr.for_torchrun(argv)
