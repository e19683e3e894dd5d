"""A CLI killed while bundling or staging leaks nothing for good: its temp bundle lives under cloudtrain's home and
is removed by the next start; a staging's abandoned ``.part`` is removed by the next staging."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.bundle.packaging import build_package
from cloudtrain.bundle.staging import bundle_prefix, stage_bundle
from tests.conftest import cli_env, wait_for

pytestmark = pytest.mark.slow


def test_a_cli_killed_while_bundling_leaves_nothing_behind(ct_home: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "data.bin").write_bytes(os.urandom(48 * 1024 * 1024))  # incompressible: bundling takes a while
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    env = {**cli_env(ct_home), "TMPDIR": str(system_tmp)}

    def bundles() -> list[Path]:
        return [*system_tmp.glob("cloudtrain-bundle-*"), *(ct_home / "tmp").glob("*/cloudtrain-bundle-*")]

    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "plan", str(proj / "train.py")], env=env,
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: bool(bundles()), timeout=60, interval=0.005)
    finally:
        proc.kill()  # SIGKILL mid-bundling: no handler, no finalizer runs
        proc.wait()
    assert list(system_tmp.iterdir()) == [], "nothing in the system's temp folder"
    assert bundles(), "the killed CLI's half-written bundle is still there (under cloudtrain's home)"

    (proj / "data.bin").unlink()
    again = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", str(proj / "train.py")], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert bundles() == [] and list((ct_home / "tmp").iterdir()) == [], "swept at the next start, and its own removed"


_WRITER = """
import sys, time
from pathlib import Path
from cloudtrain import storage

def stall(_n):
    print("writing", flush=True)
    time.sleep(3600)

storage.put_file(Path(sys.argv[1]), sys.argv[2], stall)
"""


def _writer(source: Path, uri: str, home: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(source), uri], env=cli_env(home), text=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    return proc


def test_a_staging_killed_midway_leaves_no_part_file_behind(ct_home: Path, tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(4 * 1024 * 1024))
    killed = _writer(source, f"{store}/bundles/aaaa/bundle.tar.gz", ct_home)
    killed.kill()  # SIGKILL while staging: its .part stays
    killed.wait()
    live = _writer(source, f"{store}/bundles/bbbb/bundle.tar.gz", ct_home)  # another submit, still uploading
    try:
        parts = {p.parent.name: p for p in (tmp_path / "store").rglob(".*.part")}
        assert set(parts) == {"aaaa", "bbbb"}
        for part in parts.values():  # both older than the moment a writer needs to lock its new file
            os.utime(part, (part.stat().st_atime - 60, part.stat().st_mtime - 60))

        proj = tmp_path / "proj"
        proj.mkdir()
        (proj / "train.py").write_text("print('hi')\n")
        with build_package(proj) as package:
            assert stage_bundle(package, bundle_prefix(store, package), progress=False) is True
        assert not parts["aaaa"].exists(), "the dead writer's .part is swept by the next staging"
        assert parts["bbbb"].exists(), "a live writer's .part is left alone"
    finally:
        live.kill()
        live.wait()
