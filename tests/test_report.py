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
    assert "restore" in text and ("provisioning" in text or "program startup" in text)  # losses by cause


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


def test_figures_not_known_show_a_dash_and_new_figures_show() -> None:
    """Issue 51.7: a cause of loss not known (None) is "-", not a crash; the ideal step time and its deviation are
    rows when known; event lines the timeline ignored are said, with why."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.home import goodput
    from cloudtrain.job_types import JobState, JobStatus
    from cloudtrain.show.report import page

    status = JobStatus(handle=JobHandle.parse("local://fig-20260101-000000-0000"), name="fig",
                       state=JobState.RUNNING, created_at=time.time() - 60, started_at=time.time() - 50)
    found = goodput.summarise([], status)
    causes = ("waiting", "infrastructure", "program_startup", "data_loading", "checkpoint_save", "checkpoint_restore",
              "wasted_progress", "other")
    found["goodput"] = {**found["goodput"], "losses_s": {**dict.fromkeys(causes), "checkpoint_save": 12.25},
                        "step_time_s": {"ideal": 0.25, "recent": 0.3125, "deviation": 0.0625}}
    timeline = {"events": [], "missing": 0, "logs": None,
                "ignored": {"count": 4, "kinds": {"step: not from a worker": 3, "preempted: forged": 1}}}
    text = page(status, {**found, "timeline": timeline})
    assert "waiting -, infrastructure -, program startup -" in text and "checkpoint save 12.2 s" in text
    assert "ideal step time</td><td>0.250 s (recent 0.312 s)" in text
    assert "step time deviation</td><td>0.062 s" in text
    assert "4 event line(s) ignored" in text and "step: not from a worker (3)" in text
    found["goodput"]["step_time_s"] = {"ideal": None, "recent": None, "deviation": None}
    timeline["ignored"] = {"count": 0, "kinds": {}}
    text = page(status, {**found, "timeline": timeline})
    assert "ideal step time" not in text and "ignored" not in text
    found["goodput"].pop("step_time_s")  # the figures before step times were measured
    del timeline["ignored"]
    assert "ideal step time" not in page(status, {**found, "timeline": timeline})


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


def _month(kinds: str) -> tuple[list[dict], object]:
    """A month of one job at the one-minute floor: 43,200 checkpoint events (and, for "all", as many step reports,
    5,000 platform states and 30 legs each ended by a preemption and restored from the checkpoint before it); for
    "crashloop", a restart every minute (43,200 restarts and preemptions, each leg a new lane's worth of events)."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.job_types import JobState, JobStatus

    t0 = 1_800_000_000.0
    minute = 60.0
    events: list[dict] = [{"e": "submitted", "t": t0, "handle": "local://month"},
                          {"e": "node_started", "t": t0 + 10, "attempt": 0}]
    events += [{"e": "checkpoint", "t": t0 + 30 + i * minute, "step": 100 * i, "bytes": 10 ** 9, "blocked_s": 1.5,
                "publish_s": 9.0, "node": 0} for i in range(43_200)]
    if kinds == "all":
        events += [{"e": "step", "t": t0 + 31 + i * minute, "step": 100 * i + 1, "total": 4_320_000, "node": 0}
                   for i in range(43_200)]
        events += [{"e": "state", "t": t0 + 45 + i * 518.4, "state": "running", "sagemaker_status": f"s{i % 7}"}
                   for i in range(5_000)]
        for leg in range(1, 31):  # a preemption a day, the next leg restored from the checkpoint just before it
            at = t0 + leg * 86_400 + 15
            events += [{"e": "spot_notice", "t": at - 5, "node": 0}, {"e": "preempted", "t": at, "attempt": leg - 1},
                       {"e": "node_started", "t": at + 20, "attempt": leg},
                       {"e": "restored", "t": at + 25, "step": 100 * (leg * 1440 - 1), "seconds": 3.0, "node": 0},
                       {"e": "training_again", "t": at + 26, "step": 100 * (leg * 1440 - 1), "node": 0}]
    if kinds == "crashloop":
        for i in range(43_200):
            events += [{"e": "restarted", "t": t0 + 40 + i * minute, "restarts": i + 1},
                       {"e": "preempted", "t": t0 + 41 + i * minute, "attempt": i}]
    events.sort(key=lambda e: e["t"])
    status = JobStatus(handle=JobHandle.parse("local://month-20260101-000000-0000"), name="month",
                       state=JobState.SUCCEEDED, created_at=t0, started_at=t0 + 10, ended_at=events[-1]["t"] + 1)
    return events, status


@pytest.mark.parametrize("kinds", ["checkpoints", "all", "crashloop"])
def test_a_month_at_the_one_minute_floor_stays_under_2_mb(kinds: str, tmp_path: Path) -> None:
    """Issue 51.7: 43,200 checkpoint events made a 12 MB page. Every numerous kind is thinned evenly; the first and
    last of each kind are kept, every preemption (up to what a page can hold) and the checkpoint each restore
    loaded, and the page says how many of each were left out."""
    from cloudtrain.home import goodput
    from cloudtrain.plan.cost import Rate
    from cloudtrain.show.report import page

    events, status = _month(kinds)
    rate = Rate("local", "box", 1, "spot", on_demand=4.0, spot=1.2)
    started = time.perf_counter()
    text = page(status, {"timeline": {"events": events, "missing": 0, "logs": None},
                         **goodput.summarise(events, status, rate)}, rate)
    took = time.perf_counter() - started
    size = len(text.encode())
    print(f"benchmark: report of a month ({kinds}, {len(events)} events): {size / 1e6:.2f} MB in {took:.2f} s")
    assert size < 2_000_000
    checkpoints = [e for e in events if e["e"] == "checkpoint"]
    shown = text.count("data-e='checkpoint'")
    assert 100 <= shown < len(checkpoints)
    assert re.search(rf"{len(checkpoints) - shown:,} of the 43,200 checkpoint events", text), "says how many"
    first, last = checkpoints[0], checkpoints[-1]
    assert f"checkpoint step {first['step']} at +" in text and f"checkpoint step {last['step']} at +" in text
    if kinds == "all":
        assert text.count("data-e='preempted'") == 30 and text.count("data-e='restored'") == 30  # none thinned
        assert text.count("data-e='spot_notice'") == 30
        for e in events:
            if e["e"] == "restored":  # the checkpoint each leg came back from is kept
                assert f"checkpoint step {e['step']} at +" in text, e
        assert re.search(r"[\d,]+ of the 43,200 step reports", text) and re.search(r"of the 5,000 state", text)
        assert "leg 31" in text
    if kinds == "crashloop":
        assert re.search(r"of the 43,200 preempted events", text) and re.search(r"of the 43,200 restarted", text)
        assert text.count("<svg") == 1 and int(re.search(r"<svg[^>]* height='(\d+)'", text).group(1)) < 2000
    if CHROMIUM and kinds != "checkpoints":
        (tmp_path / "month.html").write_text(text)
        dom = chromium(tmp_path / "month.html", "--dump-dom")
        no_console_errors(dom)
        assert 'data-rendered="' in dom.stdout


def test_report_into_a_folder_writes_report_of_the_job_there(preempted_job: tuple[Cli, str, Path],
                                                             tmp_path: Path) -> None:
    """Issue 51.7: `report -o EXISTING_DIR` exited 2 naming a temporary file; it writes report-JOB.html inside."""
    from cloudtrain.handles import JobHandle

    cli, handle, _ = preempted_job
    folder = tmp_path / "reports"
    folder.mkdir()
    out = cli("report", handle, "-o", str(folder))
    assert out.returncode == 0, out.stderr
    written = folder / f"report-{JobHandle.parse(handle).job_id}.html"
    assert written.read_text().startswith("<!DOCTYPE html>") and str(written) in out.stdout
    assert sorted(p.name for p in folder.iterdir()) == [written.name]  # no temporary file left beside it
    (folder / written.name).unlink()
    (folder / written.name).mkdir()  # the file's name taken by a folder: refused, said so, nothing replaced
    out = cli("report", handle, "-o", str(folder))
    assert out.returncode == 2 and "Traceback" not in out.stderr and written.name in out.stderr, out.stderr
    assert ".part" not in out.stderr and written.is_dir()


def _copy_of_device(path: str, tmp_path: Path) -> str:
    """A device node of tmp_path's own, the same device as ``path`` (so an old cloudtrain that replaced it does no
    harm to this machine's /dev); the test skips where mknod is not allowed (not root)."""
    import os
    import stat

    copy = tmp_path / Path(path).name
    try:
        os.mknod(copy, stat.S_IFCHR | 0o666, os.stat(path).st_rdev)
    except OSError as exc:
        pytest.skip(f"cannot make a device node here ({exc})")
    return str(copy)


@pytest.mark.parametrize("where", ["/dev/full", "copy of /dev/full"])
def test_report_to_a_full_device_is_a_clear_error_and_the_device_stays(preempted_job: tuple[Cli, str, Path],
                                                                       tmp_path: Path, where: str) -> None:
    """Issue 51.7: as root, `report -o /dev/full` renamed the page over the device node (gone). A target that is not
    a regular file is written as it is: /dev/full says no space left, exit 2, no traceback, the node still there."""
    import os
    import stat

    cli, handle, _ = preempted_job
    target = _copy_of_device("/dev/full", tmp_path) if where.startswith("copy") else "/dev/full"
    out = cli("report", handle, "-o", target)
    assert os.path.exists(target) and stat.S_ISCHR(os.stat(target).st_mode), "the device node was replaced"
    assert os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert target in out.stderr and "no space left" in out.stderr.lower(), out.stderr
    assert not [p for p in Path(target).parent.iterdir() if p.name.startswith(".full.")]  # no temporary left


@pytest.mark.parametrize("where", ["/dev/null", "copy of /dev/null", "fifo", "/dev/stdout"])
def test_report_to_a_file_that_is_not_regular_writes_into_it(preempted_job: tuple[Cli, str, Path], tmp_path: Path,
                                                             where: str) -> None:
    """A FIFO, /dev/null, /dev/stdout: written into as they are, never replaced (the note goes to stderr)."""
    import os
    import stat
    import threading

    cli, handle, _ = preempted_job
    read: list[bytes] = []
    if where == "fifo":
        target = str(tmp_path / "pipe.html")
        os.mkfifo(target)

        def reader() -> None:  # opened at once (no writer yet), then read until the writer has written and closed
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
            deadline = time.monotonic() + 200
            try:
                while time.monotonic() < deadline:
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:  # a writer, nothing written yet
                        chunk = None
                    if chunk:
                        read.append(chunk)
                    elif chunk == b"" and read:  # the writer closed
                        return
                    else:
                        time.sleep(0.02)
            finally:
                os.close(fd)

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
    else:
        target = _copy_of_device("/dev/null", tmp_path) if where.startswith("copy") else where
    out = cli("report", handle, "-o", target)
    if where == "fifo":
        thread.join(30)
        assert stat.S_ISFIFO(os.stat(target).st_mode), "the FIFO was replaced"
        assert b"".join(read).startswith(b"<!DOCTYPE html>") and b"".join(read).rstrip().endswith(b"</html>")
    elif where == "/dev/stdout":
        assert os.path.islink("/dev/stdout")
        assert out.stdout.startswith("<!DOCTYPE html>") and "data-e='preempted'" in out.stdout
    else:
        assert stat.S_ISCHR(os.stat(target).st_mode), "the device node was replaced"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"wrote {target}" in out.stderr  # stdout may be the page itself


def test_report_to_a_socket_is_refused(preempted_job: tuple[Cli, str, Path], tmp_path: Path) -> None:
    import os
    import socket
    import stat

    cli, handle, _ = preempted_job
    target = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(target))
        out = cli("report", handle, "-o", str(target))
    assert out.returncode == 2 and "Traceback" not in out.stderr and "socket" in out.stderr, out.stderr
    assert stat.S_ISSOCK(os.stat(target).st_mode)
