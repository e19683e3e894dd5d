"""A foreground ``submit``: stream the job's logs until it ends, resubmitting it where the platform does not restart
preempted jobs itself. Ctrl-C and SIGTERM (a CI runner stopping, ``timeout``, systemd) both cancel the job: a job
that outlives the command that owned it would run on unseen."""

from __future__ import annotations

import signal
import sys
from typing import Any

from cloudtrain.contract import EXIT_INTERRUPTED
from cloudtrain.contract import EXIT_PREEMPTED as EXIT_TERMINATED  # 128 + SIGTERM, as a shell reports it
from cloudtrain.errors import HomeError


class Terminated(Exception):
    """SIGTERM arrived while a foreground submit followed its job."""


def _raise_terminated(_signum: int, _frame: Any) -> None:
    raise Terminated


def _on_sigterm(handler: Any) -> Any:
    """Install a SIGTERM handler; returns the previous one (None where signals cannot be set: not the main thread)."""
    if handler is None:
        return None
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return None


def follow(provider: Any, handle: Any, max_restarts: int = 0, poll: float = 1.0,
           max_recovery: float | None = None, state: Any = None) -> int:
    """Stream logs until the job ends; where the platform does not restart preempted jobs itself, resubmit them
    (cloudtrain's recovery) and follow the new one; with a fallback list (``state`` from the submit), move it to
    the next provider when capacity is gone. Returns the command's exit code."""
    from cloudtrain.backoff import Backoff
    from cloudtrain.cli.render import status_text
    from cloudtrain.job_types import Capability
    from cloudtrain.jobs.budget import watcher
    from cloudtrain.jobs.fallback import move
    from cloudtrain.jobs.recovery import RESUBMIT_CAP, advance, begin, wait_steady
    from cloudtrain.providers import get_provider

    recovering = state is not None or (max_restarts > 0 and Capability.RESUBMIT in provider.capabilities)
    if recovering and state is None:
        state = begin(provider, handle, max_restarts=max_restarts, max_recovery=max_recovery)
    pacing = Backoff(base=poll, cap=max(RESUBMIT_CAP, poll))
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    chain = state.chain if state else [str(handle)]  # the recovery's own list: it grows with each resubmission
    budget = watcher(chain, say)  # max_cost: polled in a thread while the logs stream
    watching = budget.follow(provider, lambda: type(handle).parse(chain[-1]), max(poll, 1.0)) if budget else None
    previous = _on_sigterm(_raise_terminated)
    try:
        while True:
            for line in provider.logs(handle, follow=True):
                print(line, flush=True)
            status = wait_steady(provider, handle, poll=poll, state=state, log=say)
            following = advance(provider, state, status, say, backoff=pacing, mover=move) if state else None
            if following is None:
                break
            handle = following
            if handle.provider != provider.name:
                provider = get_provider(handle.provider)
    except HomeError as exc:  # the job database cannot be read (a full disk): the job itself runs on
        raise HomeError(f"{exc.message}; {handle} runs on without this command",
                        remedy=f"{exc.remedy}; then `cloudtrain logs -f {handle}` follows it again") from None
    except (KeyboardInterrupt, Terminated) as stop:
        _on_sigterm(previous)  # a second SIGTERM ends this process; the cancel below was asked for already
        print(f"\n{'SIGTERM' if isinstance(stop, Terminated) else 'interrupted'}: cancelling {handle} ...",
              file=sys.stderr)
        provider.cancel(handle)
        status = provider.wait(handle, poll=0.2)
        print(status_text(status), file=sys.stderr)
        return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    finally:
        _on_sigterm(previous)
        if watching:
            watching.set()
    print(status_text(status), file=sys.stderr)
    return 0 if status.state.value == "succeeded" else 1
