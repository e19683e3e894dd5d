"""Checkpoint before the reclaim: a node polls its platform's spot notice and asks its workers for a checkpoint.

Where the platform announces a reclaim before (or instead of) the SIGTERM, the bootstrap polls that notice in a
thread of its own, every ``EVERY`` seconds, and on the first one writes the request file
(``CLOUDTRAIN_CHECKPOINT_REQUEST``) that the runtime ``Checkpointer`` (and a plain script, docs/checkpoints.md)
reads at its next step; where the script opted in (``CLOUDTRAIN_CHECKPOINT_SIGNAL=SIGUSR1``) its workers get that
signal too. The node then runs on until the platform's SIGTERM (the usual preemption path: final save, drain, exit
"preempted").

Which notice a node polls is its node contract's ``SPOT_NOTICE`` (``ec2``, ``azure``, ``gce``), on unless the
contract's ``SPOT_NOTICE_ON`` says otherwise; ``CLOUDTRAIN_SPOT_NOTICE=on|off`` overrides that, and
``CLOUDTRAIN_METADATA_URL`` replaces the endpoint's scheme and host (tests point it at 127.0.0.1; ``off`` turns
polling off). An endpoint that does not answer the first poll is taken as absent: one log line, no more polls, the
job unchanged. Standard library only, Python 3.8; no token or response body is ever logged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from cloudtrain import contract
from cloudtrain.node import events

EVERY = 5.0  # seconds between polls: what AWS recommends for instance-action
TIMEOUT = 2.0  # seconds per request: the endpoints are link-local, an answer takes milliseconds
# Azure enables Scheduled Events on a VM's first request, which may take up to two minutes to answer.
FIRST_TIMEOUT = {"azure": 120.0}
GIVE_UP_AFTER = 3  # failures in a row, after the endpoint has answered, before polling stops
EC2_TOKEN_TTL = 21600  # seconds (IMDSv2's maximum); the token is renewed a minute before it lapses
BASES = {"ec2": "http://169.254.169.254", "azure": "http://169.254.169.254", "gce": "http://metadata.google.internal"}
PATHS = {"ec2": "/latest/meta-data/spot/instance-action",
         "azure": "/metadata/scheduledevents?api-version=2020-07-01",
         "gce": "/computeMetadata/v1/instance/preempted"}
SIGNALS = {"SIGUSR1": signal.SIGUSR1, "USR1": signal.SIGUSR1}


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Probe:
    """One platform's notice endpoint: ``__call__`` returns the notice (a dict) or None; raises OSError or
    ValueError when the endpoint cannot be read."""

    def __init__(self, kind: str, base: str, opener: Callable[..., Any] = urllib.request.urlopen) -> None:
        self.kind, self.base, self.open = kind, base.rstrip("/"), opener
        self.timeout = FIRST_TIMEOUT.get(kind, TIMEOUT)  # the first request only
        self._token: str | None = None
        self._token_until = 0.0

    @property
    def url(self) -> str:
        return self.base + PATHS[self.kind]

    def _read(self, url: str, headers: dict[str, str], method: str = "GET") -> bytes:
        request = urllib.request.Request(url, headers=headers, method=method)
        with self.open(request, timeout=self.timeout) as response:
            return bytes(response.read(65536))

    def __call__(self) -> dict[str, Any] | None:
        try:
            return getattr(self, f"_{self.kind}")()
        finally:
            self.timeout = TIMEOUT

    def _ec2(self) -> dict[str, Any] | None:
        """IMDSv2: a session token (PUT), then instance-action, which exists only once a reclaim is scheduled
        (404 before): {"action": "terminate"|"stop"|"hibernate", "time": "2026-01-01T00:02:00Z"}."""
        for attempt in (1, 2):
            if self._token is None or time.monotonic() >= self._token_until:
                self._token = self._read(self.base + "/latest/api/token", method="PUT", headers={
                    "X-aws-ec2-metadata-token-ttl-seconds": str(EC2_TOKEN_TTL)}).decode()
                self._token_until = time.monotonic() + EC2_TOKEN_TTL - 60
            try:
                body = self._read(self.url, {"X-aws-ec2-metadata-token": self._token})
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:  # the token lapsed early (IMDS restarted): one new one
                    self._token = None
                    continue
                raise
            found = json.loads(body)
            return {"action": found.get("action"), "at": found.get("time")}
        return None

    def _azure(self) -> dict[str, Any] | None:
        """Scheduled Events: a Preempt event for any VM of this VM's scale set or availability set (a node of the
        same job, whose loss ends the job too; or another job's, which costs one early checkpoint)."""
        found = json.loads(self._read(self.url, {"Metadata": "true"}))
        for event in found.get("Events") or []:
            if event.get("EventType") == "Preempt":
                return {"action": "preempt", "at": event.get("NotBefore"), "resources": event.get("Resources")}
        return None

    def _gce(self) -> dict[str, Any] | None:
        """``instance/preempted`` reads TRUE once Compute Engine has begun preempting this VM."""
        text = self._read(self.url, {"Metadata-Flavor": "Google"}).decode().strip()
        return {"action": "preempt", "at": None} if text.upper() == "TRUE" else None


def worker_pids(root: int) -> list[int]:
    """The workers: the children of the bootstrap's children (torchrun), from /proc's task children lists."""
    def children(pid: int) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (OSError, ValueError):
            return []

    return [worker for agent in children(root) for worker in children(agent)]


class NoticeWatch:
    """Polls ``probe`` every ``every`` seconds in a daemon thread until ``stop()`` or the first notice."""

    def __init__(self, probe: Probe, platform: str, request: Path, signum: int | None, every: float = EVERY) -> None:
        self.probe, self.platform, self.request, self.signum, self.every = probe, platform, request, signum, every
        self.notice: dict[str, Any] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudtrain-spot-notice", daemon=True)

    def start(self) -> NoticeWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        answered, failures, wait = False, 0, 0.0
        while not self._done.wait(wait):
            wait = self.every
            try:
                notice = self.probe()
            except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, a body that is not JSON
                failures += 1
                if not answered or failures >= GIVE_UP_AFTER:
                    why = getattr(exc, "reason", None) or exc.__class__.__name__
                    log(f"spot notices: {self.platform}'s notice endpoint {self.probe.url.split('?')[0]} "
                        f"{'did not answer' if not answered else 'stopped answering'} ({why}); not polling it")
                    return
                continue
            answered, failures = True, 0
            if notice is not None and not self._done.is_set():
                self.notice = notice
                self._ask(notice)
                return

    def _ask(self, notice: dict[str, Any]) -> None:
        """Write the request (atomically: readers see it whole, and its mtime is the request's), signal the workers
        where the script opted in, say so."""
        seen = time.time()
        tmp = self.request.with_name(self.request.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"platform": self.platform, "seen": utc(seen), **notice}))
            os.replace(tmp, self.request)
        except OSError as exc:
            log(f"warning: spot notice from {self.platform}: could not write {self.request} ({exc})")
        signalled = ""
        if self.signum is not None:
            pids = worker_pids(os.getpid())
            for pid in pids:
                try:
                    os.kill(pid, self.signum)
                except OSError:
                    continue
            signalled = f" (and sent {signal.Signals(self.signum).name} to {len(pids)} worker(s))"
        until = f", reclaim {notice['action']} at {notice['at']}" if notice.get("at") else ""
        log(f"spot notice from {self.platform} at {utc(seen)}{until}: asked the workers for a checkpoint{signalled}")
        events.emit("spot_notice", platform=self.platform, action=notice.get("action"), at=notice.get("at"))


def enabled(node_contract: Any, env: dict[str, str]) -> str | None:
    """The notice kind this node polls, or None: the contract's, unless the environment turns it off (or on)."""
    kind = getattr(node_contract, "SPOT_NOTICE", None)
    choice = env.get(contract.SPOT_NOTICE, "").strip().lower()
    if kind not in PATHS or env.get(contract.METADATA_URL, "").strip().lower() == "off" or choice in ("off", "0"):
        return None
    return str(kind) if choice in ("on", "1") or getattr(node_contract, "SPOT_NOTICE_ON", True) else None


def start(node_contract: Any, env: dict[str, str], workdir: Path) -> tuple[dict[str, str], NoticeWatch | None]:
    """What the workers' environment adds (the request file's path, always: a script may also be asked by hand),
    and the running watch where this node's platform has a notice to poll."""
    request = workdir / "checkpoint-request.json"
    with contextlib.suppress(OSError):
        request.unlink()  # an earlier run's request is not this one's
    added = {contract.CHECKPOINT_REQUEST: str(request)}
    kind = enabled(node_contract, env)
    if kind is None:
        return added, None
    raw = env.get(contract.CHECKPOINT_SIGNAL, "").strip().upper()
    if raw and raw not in SIGNALS:
        log(f"warning: {contract.CHECKPOINT_SIGNAL}={raw!r}: only SIGUSR1 is sent; the request file alone is used")
    probe = Probe(kind, env.get(contract.METADATA_URL) or BASES[kind])
    return added, NoticeWatch(probe, str(node_contract.PLATFORM), request, SIGNALS.get(raw)).start()
