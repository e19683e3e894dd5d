"""Let torch.distributed's gloo worker threads finish before Python shuts down.

A gloo collective's work object is freed on one of the process group's worker threads just after the collective
completes; if it holds tensors whose Python objects are gone, freeing them takes the GIL. When the main thread has
already begun interpreter finalization (a script that returns right after its last collective), CPython 3.11-3.13
ends such a thread with ``pthread_exit`` inside a C++ destructor, and the process aborts with "terminate called
without an active exception" (SIGABRT) *after* training finished: torchrun then reports the job failed.
``destroy_process_group`` does not join those threads while anything (a DDP module, a cached group) still holds the
group. An exit handler runs while the interpreter is whole: it releases the GIL until no gloo worker is still
running, so the pending frees complete first. Only the standard library is imported here; nodes load it from the
bundle's ``sitecustomize`` into every worker (unmodified scripts too), and ``cloudtrain.runtime`` installs it too.

The same handler then spares a process that imported torch the slowest part of its shutdown: finalization runs
several full garbage collections over torch's ~280,000 objects while it tears the modules down (0.45 s for ``import
torch`` alone, 0.85 s after a gloo DDP step, here), and each worker and torchrun itself pay it after the job's last
line. One collection now, while the interpreter is whole, finalizes whatever garbage there is, as the first of those
would; ``gc.freeze()`` then leaves the surviving objects out of the rest (0.28 s in all after a DDP step). Objects
still alive are released as modules are cleared, as before; only a reference cycle that first becomes garbage during
shutdown is no longer collected (CPython never promised to finalize those).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time

GLOO_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads (Linux)
_installed = False


def _gloo_workers() -> tuple[int, int] | None:
    """(gloo worker threads, how many of them are running rather than blocked), or None where /proc cannot tell."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = running = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name == GLOO_WORKER_THREAD:
            found += 1
            running += rest.split()[:1] in (["R"], ["D"])
    return found, running


def settle(timeout: float = 2.0, interval: float = 0.01) -> None:
    """Sleep (the GIL released) until no gloo worker thread is running, at most ``timeout`` seconds."""
    if "torch.distributed" not in sys.modules:  # no process group was ever possible: nothing to wait for
        return
    workers = _gloo_workers()
    if workers is None:  # no /proc (macOS): one short pause is what there is
        time.sleep(0.05)
        return
    if not workers[0]:  # torch imported (it imports torch.distributed) but no gloo group: no pause
        return
    deadline = time.monotonic() + timeout
    time.sleep(interval)  # a worker waiting for the GIL gets it now and turns runnable
    while (workers := _gloo_workers()) and workers[1] and time.monotonic() < deadline:
        time.sleep(interval)


def skip_final_collections() -> None:
    """In a process that imported torch: collect now, then freeze what survives (the module docstring says why)."""
    if "torch" not in sys.modules:
        return
    gc.collect()
    gc.freeze()


def at_exit() -> None:
    settle()
    skip_final_collections()


def install() -> None:
    """Register :func:`at_exit` to run at exit (once). Registered early, it runs after the script's own handlers."""
    global _installed
    if not _installed:
        atexit.register(at_exit)
        _installed = True
