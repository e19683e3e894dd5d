"""A malformed bundle given to the bootstrap (issue 15, item 13): the node reports one clear error and exits 2
(contract.EXIT_USAGE, the one code the bootstrap's first stage keeps its own copy of: a usage error, not a crash),
leaves nothing half-unpacked, and writes its status file. The bootstrap runs as a real process, as a node runs it; no
digest is passed, so the unpacking itself is what meets the bad archive."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cloudtrain.bundle.packaging import build_package
from cloudtrain.contract import EXIT_USAGE
from tests.conftest import REPO

BOOTSTRAP = REPO / "entrypoints" / "bootstrap.py"


def _tar(path: Path, *members: tuple[str, bytes | None]) -> Path:
    """A gzip tar of (name, data) members; data None makes a folder."""
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _real_bundle(tmp_path: Path) -> bytes:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('trained')\n")
    with build_package(src) as package:
        return package.path.read_bytes()


def _bundles(tmp_path: Path) -> dict[str, Path]:
    real = _real_bundle(tmp_path)
    found = {
        "member '.' as a file": _tar(tmp_path / "dot.tar.gz", ("src/train.py", b"print(1)\n"), (".", b"x")),
        "member with an empty name": _tar(tmp_path / "empty.tar.gz", ("", b"x")),
        "member './' only": _tar(tmp_path / "dotslash.tar.gz", ("./", b"x")),
        "a file where a folder is needed": _tar(tmp_path / "clash.tar.gz", ("src", b"x"), ("src/train.py", b"y")),
    }
    (tmp_path / "truncated.tar.gz").write_bytes(real[: len(real) // 2])
    found["truncated"] = tmp_path / "truncated.tar.gz"
    (tmp_path / "text.tar.gz").write_text("this is not an archive\n")
    found["not gzip"] = tmp_path / "text.tar.gz"
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("src/x.py"))
    (tmp_path / "plain.tar.gz").write_bytes(plain.getvalue())
    found["an uncompressed tar"] = tmp_path / "plain.tar.gz"
    (tmp_path / "gzip-not-tar.tar.gz").write_bytes(gzip.compress(b"gzip, but no tar inside" * 100))
    found["gzip without a tar inside"] = tmp_path / "gzip-not-tar.tar.gz"
    return found


def _node(bundle: Path, workdir: Path, status: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLOUDTRAIN_NNODES": "1", "CLOUDTRAIN_NODE_RANK": "0", "CLOUDTRAIN_MASTER_ADDR": "127.0.0.1",
           "CLOUDTRAIN_MASTER_PORT": "29999"}
    return subprocess.run([sys.executable, str(BOOTSTRAP), "--bundle", str(bundle), "--workdir", str(workdir),
                           "--script", "train.py", "--nproc-per-node", "1", "--status-file", str(status)],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["member '.' as a file", "member with an empty name", "member './' only",
                                  "a file where a folder is needed", "truncated", "not gzip",
                                  "an uncompressed tar", "gzip without a tar inside"])
def test_a_malformed_bundle_is_one_clear_error_exit_2(tmp_path: Path, case: str) -> None:
    bundle = _bundles(tmp_path)[case]
    workdir, status = tmp_path / "node", tmp_path / "node.status.json"
    result = _node(bundle, workdir, status)
    out = result.stdout + result.stderr
    assert result.returncode == EXIT_USAGE, out
    assert "Traceback" not in out
    assert "[cloudtrain] error: bundle" in out, out
    assert not (workdir / "bundle").exists(), "nothing half-unpacked is left"
    recorded = json.loads(status.read_text())
    assert recorded["outcome"] == "failed" and recorded["returncode"] == EXIT_USAGE
    assert recorded["error"].startswith("bundle")


def test_a_missing_or_unreadable_bundle_path(tmp_path: Path) -> None:
    for bundle in (tmp_path / "nothing-here", tmp_path):  # no file; a folder without bundle.tar.gz
        result = _node(bundle, tmp_path / "node", tmp_path / "s.json")
        assert result.returncode == EXIT_USAGE and "Traceback" not in result.stderr
        assert "not found" in result.stdout + result.stderr


def test_a_good_bundle_still_unpacks_and_runs(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(_real_bundle(tmp_path))
    result = _node(bundle, tmp_path / "node", tmp_path / "s.json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trained" in result.stdout + result.stderr
