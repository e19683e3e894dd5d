"""Issue 41.3: `cloudtrain report HANDLE`, one self-contained HTML page of a job's timeline, rendered in a real
headless Chromium (Debian's `chromium`): it draws, names each event, and logs no console error. A real local job,
preempted once and restarted from its checkpoint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from subprocess import CompletedProcess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import status_json
from tests.preempted_job import READS_IT

if TYPE_CHECKING:
    from tests.preempted_job import Cli

pytestmark = [pytest.mark.slow, READS_IT]  # every test reads the one preempted job (tests/preempted_job.py)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not __import__("os").environ.get("CI"),
                                    reason="no chromium here (apt-get install chromium; CI installs it)")


def chromium(page: Path, *flags: str) -> CompletedProcess[str]:
    assert CHROMIUM is not None, "CI must have chromium (.ci/run installs it)"
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                           "--v=0", "--user-data-dir=" + str(page.parent / "chromium-profile"), *flags,
                           page.as_uri()], capture_output=True, text=True, timeout=120)


def no_console_errors(out: CompletedProcess[str]) -> None:
    assert not re.search(r"Uncaught|ERROR:CONSOLE|CONSOLE\(\d+\)\].*(Error|error)", out.stderr), out.stderr


def test_report_is_one_offline_page(preempted_job: tuple[Cli, str, Path], tmp_path: Path) -> None:
    cli, handle, _ = preempted_job
    target = tmp_path / "job.html"
    out = cli("report", handle, "-o", str(target))
    assert out.returncode == 0, out.stderr
    text = target.read_text()
    assert target.stat().st_size < 2_000_000
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched: opens offline
    assert "<link" not in text and "@import" not in text
    events = status_json(cli, handle)["timeline"]["events"]
    for kind in ("submitted", "node_started", "checkpoint", "preempted", "restored", "training_again", "ended"):
        assert f"data-e='{kind}'" in text, kind  # drawn, with a <title> naming it
    assert text.count("<tr><td>+") == len(events)  # and listed, each (no step report thinned: a short job)
    assert "leg 2" in text and "cost over time: USD" in text and "goodput" in text
    assert "restore" in text and "provisioning" in text  # losses by cause


@needs_chromium
def test_report_renders_in_chromium(preempted_job: tuple[Cli, str, Path], tmp_path: Path) -> None:
    cli, handle, _ = preempted_job
    target = tmp_path / "job.html"
    assert cli("report", handle, "-o", str(target)).returncode == 0
    dom = chromium(target, "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    no_console_errors(dom)
    marks = int(re.search(r'data-rendered="(\d+)"', dom.stdout).group(1))  # the page's script ran
    drawn = len(re.findall(r"data-e=", target.read_text()))
    assert marks == drawn > 5
    for kind in ("checkpoint", "preempted", "restored", "ended"):
        assert re.search(rf"<title>{kind}[^<]* at \+", dom.stdout), kind  # each mark named in the rendered DOM
    shot = chromium(target, "--screenshot=" + str(tmp_path / "shot.png"), "--window-size=1400,1000")
    no_console_errors(shot)
    assert (tmp_path / "shot.png").stat().st_size > 10_000


def test_missing_and_never_started_still_render(preempted_job: tuple[Cli, str, Path], tmp_path: Path) -> None:
    """A job with no events (never started) and one whose events were partly lost: the page says what is missing."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.job_types import JobState, JobStatus
    from cloudtrain.show.report import page

    never = JobStatus(handle=JobHandle.parse("local://never-20260101-000000-0000"), name="never",
                      state=JobState.PENDING, created_at=time.time())
    empty = {"events": [], "missing": 0, "logs": None}
    found = {"timeline": empty, **__import__("cloudtrain.home.goodput", fromlist=["x"]).summarise([], never)}
    text = page(never, found)
    assert "No events are known for this job" in text and "no step reported" in text
    torn = {**found, "timeline": {**empty, "missing": 3,
                                  "logs": "the nodes' events are not known: their logs could not be read (gone)"}}
    text = page(never, torn)
    assert "3 event line(s) were cut short" in text and "logs could not be read (gone)" in text
    if CHROMIUM:
        (tmp_path / "never.html").write_text(text)
        dom = chromium(tmp_path / "never.html", "--dump-dom")
        no_console_errors(dom)
        assert 'data-rendered="0"' in dom.stdout


def test_ten_thousand_events_stay_under_2_mb(tmp_path: Path) -> None:
    from cloudtrain.handles import JobHandle
    from cloudtrain.home import goodput
    from cloudtrain.job_types import JobState, JobStatus
    from cloudtrain.plan.cost import Rate
    from cloudtrain.show.report import page

    t0 = 1_800_000_000.0
    events = [{"e": "submitted", "t": t0, "handle": "local://big"}]
    for leg in range(10):
        start = t0 + 10 + leg * 3600
        events.append({"e": "node_started", "t": start, "attempt": leg})
        events += [{"e": "step", "t": start + 5 + i * 3.4, "step": leg * 800 + i, "total": 8000, "node": 0}
                   for i in range(907)]
        events += [{"e": "checkpoint", "t": start + 5 + i * 34, "step": leg * 800 + i * 10, "bytes": 10 ** 9,
                    "blocked_s": 1.5, "publish_s": 9.0, "node": 0} for i in range(90)]
        events += [{"e": "spot_notice", "t": start + 3080, "node": 0}, {"e": "preempted", "t": start + 3100,
                                                                         "attempt": leg}]
    events.sort(key=lambda e: e["t"])
    assert len(events) >= 10_000
    status = JobStatus(handle=JobHandle.parse("local://big-20260101-000000-0000"), name="big",
                       state=JobState.SUCCEEDED, created_at=t0, started_at=t0 + 10, ended_at=events[-1]["t"])
    rate = Rate("local", "box", 1, "spot", on_demand=4.0, spot=1.2)
    started = time.perf_counter()
    text = page(status, {"timeline": {"events": events, "missing": 0, "logs": None},
                         **goodput.summarise(events, status, rate)}, rate)
    took = time.perf_counter() - started
    size = len(text.encode())
    print(f"benchmark: report of {len(events)} events: {size / 1e6:.2f} MB in {took:.2f} s")
    assert size < 2_000_000
    assert text.count("data-e='checkpoint'") == 900 and text.count("data-e='preempted'") == 10  # none thinned
    if CHROMIUM:
        (tmp_path / "big.html").write_text(text)
        dom = chromium(tmp_path / "big.html", "--dump-dom")
        no_console_errors(dom)
        assert 'data-rendered="' in dom.stdout


def test_unknown_handle_is_exit_2(preempted_job: tuple[Cli, str, Path], tmp_path: Path) -> None:
    cli, _, _ = preempted_job
    for handle in ("local://no-such-job-20260101-000000-0000", "nosuch://x"):
        out = cli("report", handle, "-o", str(tmp_path / "r.html"))
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "fix:" in out.stderr or "cloudtrain list" in out.stderr
    assert not (tmp_path / "r.html").exists()
    from tests.conftest import cli_env

    (tmp_path / "home-file").write_text("")  # a home that is not a folder: the user's to fix, said so
    out = subprocess.run([sys.executable, "-m", "cloudtrain", "report", "local://x-20260101-000000-0000", "-o",
                          str(tmp_path / "r.html")], env=cli_env(tmp_path / "home-file"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "fix:" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "r.html").exists()


def test_run_shows_the_report_in_a_notebook(preempted_job: tuple[Cli, str, Path]) -> None:
    _, handle, home = preempted_job
    code = ("from cloudtrain.sdk import Run\nimport sys\nh = Run.attach(sys.argv[1])._repr_html_()\n"
            "assert \"data-e='preempted'\" in h and '<svg' in h and '<html' not in h, h[:300]\nprint('ok')")
    from tests.conftest import cli_env

    out = subprocess.run([sys.executable, "-c", code, handle], env=cli_env(home), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    gone = "from cloudtrain.sdk import Run\nprint(Run.attach('local://gone-20260101-000000-0000')._repr_html_())"
    out = subprocess.run([sys.executable, "-c", gone], env=cli_env(home), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "status unavailable: no local job" in out.stdout, out.stderr
