"""What a node leaves behind (issue 28.7, 28.11): a plain script's final files that cannot be copied to the output
location leave the job `failed`, saying why and where the files still are, as unpublished checkpoints do; and no
process the job started outlives its node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import stop_every_job
from tests.support import Cloudtrain

pytestmark = pytest.mark.slow


def test_outputs_that_do_not_reach_their_location_fail_the_job(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "final.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['CLOUDTRAIN_OUTPUT_DIR'], 'model.pt').write_bytes(b'weights')\n"
        "print('saved the final model', flush=True)\n")
    (tmp_path / "full").write_text("a file where the output folder should be: every write under it fails")
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    try:
        run = ct("submit", str(proj / "final.py"), "--output-uri", (tmp_path / "full" / "out").as_uri(), check=False)
        out = run.stdout + run.stderr
        assert "saved the final model" in out and run.returncode == 1, out[-3000:]
        handle = out.split("local://", 1)[1].split()[0]
        status = ct.status(f"local://{handle}")
        assert status["state"] == "failed"
        assert "copying outputs to" in status["message"] and "the files are still in" in status["message"]
        kept = status["message"].split("the files are still in ", 1)[1].split(" on this node")[0]
        assert (Path(kept) / "model.pt").read_bytes() == b"weights"
        assert ct("wait", f"local://{handle}", check=False).returncode == 1
    finally:
        stop_every_job(tmp_path / "home")


def test_nothing_the_job_started_outlives_its_node(tmp_path: Path) -> None:
    """Issue 28.11: a helper in its own session with a cleaned environment (so no marker variable reaches it)
    is ended when the node ends, on success too, and the node says so."""
    from cloudtrain.home.procs import is_alive
    from tests.conftest import SCRIPTS

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helper.py").write_text((SCRIPTS / "leaves_a_helper_running.py").read_text())
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    pid_file = tmp_path / "helper.pid"
    try:
        out = ct("submit", str(proj / "helper.py"), "--", str(pid_file)).stdout
        pid = int(pid_file.read_text())
        assert not is_alive(pid), f"helper {pid} outlived the job"
        assert "ended 1 process(es) the job left running" in out and str(pid) in out, out[-2000:]
    finally:
        if pid_file.exists() and is_alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), 9)
        stop_every_job(tmp_path / "home")
