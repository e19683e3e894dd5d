"""Object-storage emulators for tests, each started on 127.0.0.1 with a free port and reached by the real client.

In CI (CI=true) an emulator that cannot start fails the run; elsewhere the test is skipped and says why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AZURITE_CONN = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"emulator unavailable in CI: {reason}")
    pytest.skip(reason)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"emulator did not listen on {port} within {timeout}s")


class Emulator:
    def __init__(self, argv: list[str], port: int, env: dict[str, str], log: Path) -> None:
        self.port, self.env = port, env
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            wait_port(port, self.proc)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def start_s3(tmp: Path) -> Emulator:
    port = free_port()
    env = {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    return Emulator([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, env,
                    tmp / "moto.log")


def start_gcs(tmp: Path) -> Emulator:
    port = free_port()
    exe = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).parent / "gcp-storage-emulator")
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GOOGLE_CLOUD_PROJECT": "local"}
    return Emulator([exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"], port, env,
                    tmp / "gcs.log")


def azurite_binary() -> str | None:
    candidates = [os.environ.get("AZURITE_BIN"), str(REPO / ".nox" / "node" / "node_modules" / ".bin" / "azurite-blob"),
                  shutil.which("azurite-blob")]
    return next((c for c in candidates if c and Path(c).exists()), None)


def start_azure(tmp: Path) -> Emulator:
    exe = azurite_binary()
    if exe is None:
        raise RuntimeError("azurite-blob not found (npm install azurite, or set AZURITE_BIN)")
    port = free_port()
    (tmp / "azurite").mkdir(exist_ok=True)
    env = {"AZURE_STORAGE_CONNECTION_STRING": AZURITE_CONN.format(port=port)}
    return Emulator([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(tmp / "azurite"),
                     "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"], port, env,
                    tmp / "azurite.log")


STARTERS = {"s3": start_s3, "gs": start_gcs, "az": start_azure}
BUCKET = "cloudtrain-test"


def create_bucket(scheme: str) -> None:
    if scheme == "s3":
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
    elif scheme == "gs":
        from cloudtrain.storage.gcs import GCSStore

        GCSStore().client.create_bucket(BUCKET)
    elif scheme == "az":
        from cloudtrain.storage.azure import AzureBlobStore

        AzureBlobStore()._service(None).create_container(BUCKET)


@pytest.fixture(scope="session")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Emulator | str]]:
    """Started lazily, once per session, by ``store_root``."""
    running: dict[str, Emulator | str] = {}
    yield running
    for emulator in running.values():
        if isinstance(emulator, Emulator):
            emulator.stop()


def ensure(scheme: str, emulators: dict[str, Emulator | str], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulator for ``scheme`` running (started once per session) and its client settings in the environment of
    this test (and every job it starts) only: ``monkeypatch`` undoes them when the test ends."""
    if scheme == "file":
        return
    if scheme not in emulators:
        try:
            emulators[scheme] = STARTERS[scheme](tmp)
        except (RuntimeError, OSError) as exc:
            emulators[scheme] = f"{scheme} emulator: {exc}"
        else:
            _set_env(emulators[scheme], monkeypatch)  # type: ignore[arg-type]
            create_bucket(scheme)
    emulator = emulators[scheme]
    if isinstance(emulator, str):
        unavailable(emulator)
        return
    _set_env(emulator, monkeypatch)


def _set_env(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in emulator.env.items():
        monkeypatch.setenv(key, value)


def root_uri(scheme: str, tmp: Path) -> str:
    if scheme == "file":
        return (tmp / f"store-{uuid.uuid4().hex[:8]}").as_uri()
    return f"{scheme}://{BUCKET}/{uuid.uuid4().hex[:12]}"
