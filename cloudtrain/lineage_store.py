"""A job chain's recovery state kept in its checkpoint store, beside its checkpoints (``<checkpoint.uri>/_cloudtrain/
lineage.json``), and the lease that lets one watcher at a time drive it: a watcher on another machine, or one
restarted with an empty home, picks up the same chain, and two watchers never both resubmit.

The lease is an object holding its owner and when it expires. Object stores offer no portable compare-and-swap, so
taking it is write, wait, read back: two watchers that write at once both read back the last writer's and only it
goes on. A watcher renews it on every round; one that dies leaves it to expire (``LEASE_SECONDS``).
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

from cloudtrain import storage
from cloudtrain.backoff import SYSTEM, Clock

LEASE_SECONDS = 120.0  # a watcher silent this long is taken for dead; another may take the chain over
SETTLE_SECONDS = 1.0  # between writing the lease and reading it back (how long the store takes to agree)
_FOLDER = "_cloudtrain"  # not step-<N>: never taken for a checkpoint, never deleted by retention


def state_uri(checkpoint_uri: str) -> str:
    return storage.join(checkpoint_uri, _FOLDER, "lineage.json")


def _lease_uri(state: str) -> str:
    return state.rsplit("/", 1)[0] + "/lease.json"


def publish(uri: str, data: dict[str, Any]) -> None:
    storage.with_retries(lambda: storage.write_bytes(uri, json.dumps(data, indent=1).encode()), f"writing {uri}")


def read(uri: str) -> dict[str, Any] | None:
    if not storage.exists(uri):
        return None
    try:
        data = json.loads(storage.read_bytes(uri))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def owner_id() -> str:
    """This watcher: host, process and a random part (two watchers in one process are two owners)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def take_lease(state: str, owner: str, clock: Clock = SYSTEM, settle: float | None = None) -> bool:
    """Take or renew the lease of the chain whose state is at ``state``; False: another live watcher holds it."""
    uri = _lease_uri(state)
    held = read(uri)
    now = clock.time()
    if held and held.get("owner") != owner and float(held.get("expires", 0)) > now:
        return False
    renewing = bool(held and held.get("owner") == owner)
    publish(uri, {"owner": owner, "expires": now + LEASE_SECONDS})
    if not renewing:
        clock.sleep(SETTLE_SECONDS if settle is None else settle)
        held = read(uri)
    return bool(held and held.get("owner") == owner)


def release(state: str, owner: str) -> None:
    uri = _lease_uri(state)
    held = read(uri)
    if held and held.get("owner") == owner:
        publish(uri, {"owner": owner, "expires": 0})
