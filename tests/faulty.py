"""The ``faulty`` fixture: a storage emulator behind a fresh FaultProxy (tests/faultproxy.py), the clients' environment
pointed at the proxy, and the cloud client's own retries counted. Used by tests/test_faults.py and
tests/test_gcs_upload.py; tests/conftest.py makes it a fixture everywhere.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cloudtrain import storage
from tests.emulators import Emulator, ensure, root_uri
from tests.faultproxy import FaultPlan, FaultProxy

ENDPOINT_ENV = {"s3": "AWS_ENDPOINT_URL_S3", "gs": "STORAGE_EMULATOR_HOST", "az": "AZURE_STORAGE_CONNECTION_STRING"}
MIB = 1 << 20
# Seed 9 draws 9 faults in the first 30 requests at this rate: every kind is hit even on the shortest run.
PLAN = FaultPlan(rate=0.25, seed=9, delay=0.3)


@dataclass
class Faulty:
    scheme: str
    proxy: FaultProxy
    root: str
    client_retries: _Tally  # retries the cloud client made on its own


class _Tally:
    """A counter bumped from the clients' worker threads (TransferManager, Azure's parallel block upload)."""

    def __init__(self) -> None:
        self._lock, self.value = threading.Lock(), 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.value += n


class _RetryLog(logging.Handler):
    """google-api-core logs each retry it sleeps before ("Retrying due to ..."); that is the count GCS exposes."""

    def __init__(self, tally: _Tally) -> None:
        super().__init__(logging.DEBUG)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying due to"):
            self.tally.add()


def _instrument(scheme: str, root: str, conn: str) -> tuple[_Tally, Callable[[], None]]:
    """Count the client's own retries; returns (tally, undo)."""
    store: Any = storage.store_for(root)
    tally = _Tally()
    if scheme == "s3":
        def after_call(parsed: dict[str, Any], **_: Any) -> None:
            tally.add(int(parsed.get("ResponseMetadata", {}).get("RetryAttempts", 0)))

        store.client.meta.events.register("after-call.s3", after_call)
        return tally, lambda: None
    if scheme == "gs":
        handler, logger = _RetryLog(tally), logging.getLogger("google.api_core.retry")
        level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)

        def undo() -> None:
            logger.removeHandler(handler)
            logger.setLevel(level)

        return tally, undo
    from azure.storage.blob import BlobServiceClient, LinearRetry

    class CountingRetry(LinearRetry):
        def sleep(self, settings: Any, transport: Any) -> None:
            tally.add()
            super().sleep(settings, transport)

    # The SDK's default ExponentialRetry waits 15-21 s before its first retry; same client, shorter waits. A 4 MiB
    # single-put limit sends the few-MB shard as Put Block + Put Block List, the path above 64 MiB by default.
    store._services[None] = BlobServiceClient.from_connection_string(
        conn, max_single_put_size=4 * MIB, max_block_size=4 * MIB,
        retry_policy=CountingRetry(backoff=0, random_jitter_range=1, retry_total=3))
    return tally, lambda: None


@pytest.fixture
def faulty(request: pytest.FixtureRequest, emulators: dict[str, Emulator | str],
           tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faulty]:
    """The emulator for ``request.param`` behind a fresh FaultProxy; the client env points at the proxy."""
    scheme = request.param
    tmp = tmp_path_factory.getbasetemp()
    ensure(scheme, emulators, tmp, monkeypatch)
    emulator = emulators[scheme]
    assert isinstance(emulator, Emulator)
    proxy = FaultProxy(emulator.port, flavor=scheme, plan=PLAN).start()
    name = ENDPOINT_ENV[scheme]
    conn = os.environ[name].replace(f"127.0.0.1:{emulator.port}", f"127.0.0.1:{proxy.port}")
    monkeypatch.setenv(name, conn)
    storage._store.cache_clear()  # stores are cached per scheme with the client built from the env of the day
    count, undo = _instrument(scheme, root_uri(scheme, tmp), conn)
    try:
        yield Faulty(scheme, proxy, root_uri(scheme, tmp), count)
    finally:
        undo()
        proxy.stop()
        storage._store.cache_clear()  # later tests get clients for the emulator itself again
