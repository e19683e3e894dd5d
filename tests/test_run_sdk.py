"""Issue 29.8, the SDK and CLI a first hour uses: ``print(run.status())`` prints what `cloudtrain status` prints (not
a dataclass), ``Run.preempt()`` does what `cloudtrain preempt` does, and `logs --merge` (``run.logs(merge=True)``)
gives every node's lines in one stream ordered by time. Issue 51.10: all of what `cloudtrain status HANDLE` prints
(progress and goodput too), and ``Run.report()`` writes the page `cloudtrain report` writes. Real local jobs
(torchrun, gloo)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from cloudtrain import Job, Run
from cloudtrain.errors import UserError
from cloudtrain.job_types import JobState, JobStatus
from tests.conftest import SCRIPTS

pytestmark = pytest.mark.slow


def project(tmp_path: Path, name: str) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / name).write_text((SCRIPTS / name).read_text())
    return proj


def test_print_of_a_status_is_what_cloudtrain_status_prints(cli, ct_home: Path, tmp_path: Path) -> None:
    proj = project(tmp_path, "takes_turns.py")
    run = Job(script="takes_turns.py", source_dir=str(proj), nodes=2, procs_per_node=1, args=["0.1"]).submit("local")
    final = run.wait(timeout=240, progress=False)
    assert final.state is JobState.SUCCEEDED, final
    shown = cli("status", str(run.handle))
    assert str(run.status()) == shown.stdout.rstrip("\n"), (str(run.status()), shown.stdout)
    assert str(final).startswith(f"{run.handle}  succeeded") and "JobStatus(" not in str(final)


def test_the_sdk_shows_the_progress_goodput_and_report_the_cli_shows(cli, ct_home: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, ``print(run.status())`` left out the progress and goodput lines `status` prints, and only the CLI
    wrote a job's report."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "steps.py").write_text("import time\nfrom cloudtrain.runtime import report_step\n"
                                   "for step in range(1, 11):\n    time.sleep(0.05)\n    report_step(step, total=10)\n")
    run = Job(script="steps.py", source_dir=str(proj), procs_per_node=1).submit("local")
    assert run.wait(timeout=240, progress=False).state is JobState.SUCCEEDED
    status = run.status()
    shown = cli("status", str(run.handle)).stdout.rstrip("\n")
    assert "progress: step 10/10 (100%)" in shown and "goodput: " in shown, shown
    assert str(status) == repr(status) == shown == str(run)
    assert status.state is JobState.SUCCEEDED and status.handle == run.handle  # still the JobStatus it was
    assert status.to_dict()["state"] == "succeeded" and isinstance(status, JobStatus)

    written = run.report(tmp_path / "sdk.html")
    assert written == (tmp_path / "sdk.html").resolve()
    assert cli("report", str(run.handle), "-o", str(tmp_path / "cli.html")).returncode == 0
    assert written.read_text() == (tmp_path / "cli.html").read_text()
    assert "progress" in written.read_text() and "goodput" in written.read_text()
    monkeypatch.chdir(tmp_path)  # no path: report-<job id>.html here, as `cloudtrain report` names it
    assert run.report() == (tmp_path / f"report-{run.handle.job_id}.html").resolve()
    assert (tmp_path / f"report-{run.handle.job_id}.html").read_text() == written.read_text()


def test_run_preempt_is_cloudtrain_preempt(ct_home: Path, tmp_path: Path) -> None:
    proj = project(tmp_path, "sleeper.py")
    run = Job(script="sleeper.py", source_dir=str(proj), procs_per_node=1).submit("local")
    deadline = time.monotonic() + 240
    while "ready rank=0" not in "\n".join(run.logs()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.5)
    stopped = run.preempt()
    assert stopped.state in (JobState.STOPPING, JobState.PREEMPTED), stopped
    assert run.wait(timeout=120, progress=False).state is JobState.PREEMPTED
    with pytest.raises(UserError, match="only a running job can be preempted"):
        run.preempt()
    with pytest.raises(UserError, match="cannot be preempted on request"):
        Run.attach("gcp://my-project/us-central1/123").preempt()


def test_logs_merge_orders_every_nodes_lines_by_time(cli, ct_home: Path, tmp_path: Path) -> None:
    """Before, non-follow logs came node by node, with no way to see them in the order they happened."""
    proj = project(tmp_path, "takes_turns.py")
    run = Job(script="takes_turns.py", source_dir=str(proj), nodes=2, procs_per_node=1, args=["2"]).submit("local")
    assert run.wait(timeout=240, progress=False).state is JobState.SUCCEEDED
    order = [f"turn {t} rank {r}" for t in range(3) for r in range(2)]

    def turns(lines: list[str]) -> list[str]:
        return [m.group(0) for line in lines if (m := re.search(r"turn \d rank \d", line))]

    assert turns(list(run.logs())) == sorted(order, key=lambda t: t[-1])  # node by node, as before
    merged = cli("logs", str(run.handle), "--merge")
    assert merged.returncode == 0, merged.stderr
    assert turns(merged.stdout.splitlines()) == order, merged.stdout
    assert turns(list(run.logs(merge=True))) == order
    assert sorted(merged.stdout.splitlines()) == sorted(cli("logs", str(run.handle)).stdout.splitlines())


def test_logs_merge_where_a_provider_cannot_order_lines(cli) -> None:
    result = cli("logs", "azure://sub/rg/ws/job-1", "--merge")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot order its nodes' log lines by time" in result.stderr and "--merge" in result.stderr, result.stderr
