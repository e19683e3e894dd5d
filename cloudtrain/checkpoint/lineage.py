"""The store side of a job chain's lineage: its recovery state kept in its checkpoint store, beside its checkpoints
(``<checkpoint.uri>/_cloudtrain/lineage.json``), and the lease that lets one watcher at a time drive it: a watcher
on another machine, or one restarted with an empty home, picks up the same chain, and two watchers never both
resubmit.

The lease is an object holding its owner and when it expires. Object stores offer no portable compare-and-swap, so
taking it is write, wait, read back: two watchers that write at once both read back the last writer's and only it
goes on. A watcher renews it on every round; one that dies leaves it to expire (``LEASE_SECONDS``). Whatever the
store holds is checked before it is trusted: a lease of another shape, or one that expires further ahead than a lease
lasts (a watcher whose clock ran ahead wrote it), holds no chain, and is said so.

The same mechanics (``claim``, ``release_at``) hold the writer lease of a checkpoint URI (writer.py: one live job
writes there at a time), so a store is never trusted two ways.

Stdlib only, like the rest of the component; what a chain's state may hold is checked client-side
(cloudtrain/jobs/chain_file.py), and the watchers that drive chains are cloudtrain/jobs/watcher.py.
"""

from __future__ import annotations

import json
import math
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from cloudtrain import safe_json, storage
from cloudtrain.backoff import SYSTEM, Clock
from cloudtrain.errors import UserError

LEASE_SECONDS = 120.0  # a watcher silent this long is taken for dead; another may take the chain over
CLOCK_SKEW_SECONDS = 60.0  # how far two watchers' clocks may disagree and a lease still be trusted
SETTLE_SECONDS = 1.0  # between writing the lease and reading it back (how long the store takes to agree)
_FOLDER = "_cloudtrain"  # not step-<N>: never taken for a checkpoint, never deleted by retention


class Unreadable(UserError):
    """A state file (or a lease) that is not what cloudtrain writes there."""


def is_number(value: Any, least: float = -math.inf) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= least


def state_uri(checkpoint_uri: str) -> str:
    return storage.join(checkpoint_uri, _FOLDER, "lineage.json")


def store_file(checkpoint_uri: str, name: str) -> str:
    """A file of cloudtrain's own beside a URI's checkpoints (never taken for one, never deleted by retention)."""
    return storage.join(checkpoint_uri, _FOLDER, name)


def _lease_uri(state: str) -> str:
    return state.rsplit("/", 1)[0] + "/lease.json"


def write(uri: str, data: dict[str, Any]) -> None:
    """The JSON object ``data`` at ``uri`` (a chain's state, a lease), with retries."""
    storage.with_retries(lambda: storage.write_bytes(uri, json.dumps(data, indent=1).encode()), f"writing {uri}")


def read(uri: str) -> dict[str, Any] | None:
    """The JSON object at ``uri``; None when there is none; Unreadable when the file holds something else."""
    if not storage.exists(uri):
        return None
    try:  # safe_json: a file nested deeper than any cloudtrain writes, or too large, is refused like garbage
        data = safe_json.loads(storage.read_bytes(uri), uri)
    except safe_json.UnreadableJson as exc:
        raise Unreadable(exc.message, remedy="delete it; cloudtrain writes it again") from None
    except FileNotFoundError:  # gone since exists(): none
        return None
    except OSError as exc:  # file://: a folder, a FIFO, a file this user may not read in its place
        raise Unreadable(f"cannot read {uri}: {exc.strerror or exc}",
                         remedy="delete it (cloudtrain writes it again), or let this user read it") from None
    if not isinstance(data, dict):
        raise Unreadable(f"{uri} holds {type(data).__name__}, not a JSON object",
                         remedy="delete it; cloudtrain writes it again")
    return data


def owner_id() -> str:
    """This watcher: host, process and a random part (two watchers in one process are two owners)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease(uri: str, now: float | None, log: Callable[[str], None] | None = None,
          holder: str = "watcher") -> dict[str, Any] | None:
    """The lease at ``uri`` if it may be trusted: ``{"owner": str, "expires": seconds, ...}``, expiring no further
    ahead of ``now`` than a lease lasts (None: however far). Anything else holds nothing (said with ``log``): it is
    taken over. ``holder``: who holds such leases, in what is said (a watcher, a job)."""
    try:
        held = read(uri)
        wrong = None if held is None else _untrusted(uri, held, now, holder)
    except Unreadable as exc:
        held, wrong = None, exc.message
    if wrong is None:
        return held
    if log is not None:
        log(f"{wrong}; not trusted: this {holder} takes the lease over")
    return None


def _untrusted(uri: str, held: dict[str, Any], now: float | None, holder: str = "watcher") -> str | None:
    owner, expires = held.get("owner"), held.get("expires")
    if not isinstance(owner, str) or not isinstance(expires, (int, float)) or not is_number(expires):
        return (f"{uri} is not a lease cloudtrain wrote (owner {owner!r}, expires {expires!r}; expected a {holder}'s "
                "name and a time in seconds)")
    if now is not None and expires > now + LEASE_SECONDS + CLOCK_SKEW_SECONDS:
        return (f"the lease {uri} of {owner} expires {expires - now:.0f}s from now, further ahead than a lease lasts "
                f"({LEASE_SECONDS:.0f}s): that {holder}'s clock is wrong")
    return None


def claim(uri: str, owner: str, clock: Clock = SYSTEM, settle: float | None = None,
          log: Callable[[str], None] | None = None,
          record: Callable[[dict[str, Any] | None], dict[str, Any]] | None = None,
          may_take: Callable[[dict[str, Any]], bool] | None = None,
          holder: str = "watcher") -> tuple[bool, dict[str, Any] | None]:
    """Take or renew the lease at ``uri`` for ``owner``: write, wait ``settle``, read back (a renewal, the lease
    already ``owner``'s, is one write). A live lease of another owner is taken only where ``may_take(it)`` says so.
    ``record(the lease found, or None)``: what else the lease says (who holds it, for whoever is refused). Returns
    whether ``owner`` holds it, and the lease the store holds (another's, where it does not)."""
    now = clock.time()
    held = lease(uri, now, log, holder)
    if held and held["owner"] != owner and held["expires"] > now and not (may_take and may_take(held)):
        return False, held
    renewing = bool(held and held["owner"] == owner)
    write(uri, {**(record(held) if record else {}), "owner": owner, "expires": now + LEASE_SECONDS})
    if not renewing:
        clock.sleep(SETTLE_SECONDS if settle is None else settle)
        held = lease(uri, clock.time(), holder=holder)
    return bool(held and held["owner"] == owner), held


def release_at(uri: str, owner: str, holder: str = "watcher") -> bool:
    """Give up the lease at ``uri`` if ``owner`` still holds it (it expires now); whether it did."""
    held = lease(uri, None, holder=holder)
    if not (held and held["owner"] == owner):
        return False
    write(uri, {**held, "expires": 0})
    return True


def take_lease(state: str, owner: str, clock: Clock = SYSTEM, settle: float | None = None,
               log: Callable[[str], None] | None = None) -> bool:
    """Take or renew the lease of the chain whose state is at ``state``; False: another live watcher holds it."""
    return claim(_lease_uri(state), owner, clock, settle, log)[0]


def release(state: str, owner: str) -> None:
    release_at(_lease_uri(state), owner)
