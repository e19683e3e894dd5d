"""Nodes start from the real values, and the real values stay off command lines (issue 28.2): masking is for
display, never for what runs. A local job whose requirement is a wheel behind basic auth (the token in the URL, as
private indexes hand them out) and whose secret value also occurs in its script's name."""

from __future__ import annotations

import base64
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import stop_every_job
from tests.support import Cloudtrain

pytestmark = pytest.mark.slow
TOKEN = "s3cr3t-t0ken-4f9a"


def wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel: module ``private_pkg`` with ``VALUE``."""
    path = folder / "private_pkg-1.0-py3-none-any.whl"
    info = "private_pkg-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("private_pkg.py", "VALUE = 'installed from the private index'\n")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: private_pkg\nVersion: 1.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def private_index(tmp_path: Path) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that serves the wheel only with the token (basic auth)."""
    served = wheel(tmp_path)
    expected = "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib names it so
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="private"')
                self.end_headers()
                return
            data = served.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://user:{TOKEN}@127.0.0.1:{server.server_address[1]}/{served.name}"
    server.shutdown()


def test_secrets_reach_pip_and_the_script_but_no_command_line(tmp_path: Path, private_index: str) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "demo.py").write_text(
        "import os, private_pkg, sys\n"
        "print('value:', private_pkg.VALUE, flush=True)\n"
        "print('password is right:', os.environ['DB_PASSWORD'] == 'demo', flush=True)\n")
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    try:
        run = ct("submit", str(proj / "demo.py"), "--env", "DB_PASSWORD=demo", "--set",
                 f"requirements=['private_pkg @ {private_index}']", check=False)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-4000:]
        # the script ran under its own name with the real environment, and pip got the real URL
        assert "value: installed from the private index" in out and "password is right: True" in out
        assert TOKEN not in out  # and nothing shows it
        record = next((tmp_path / "home" / "jobs").iterdir())
        assert not [p for p in record.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()
                    and p.name != "requirements.cloudtrain.txt"]
        listed = next(record.rglob("requirements.cloudtrain.txt"))
        assert listed.stat().st_mode & 0o077 == 0  # readable by the job's user only
        plan = ct("plan", str(proj / "demo.py"), "--env", "DB_PASSWORD=demo", "--set",
                  f"requirements=['private_pkg @ {private_index}']", "-o", "json").stdout
        assert TOKEN not in plan and "--requirement=@@CLOUDTRAIN_SECRET_ARG_0@@" in plan
    finally:
        stop_every_job(tmp_path / "home")
