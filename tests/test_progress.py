"""Progress output: quiet for quick work, plain lines in logs, one redrawn line on a terminal; HTML reprs escape."""

from __future__ import annotations

import io
import time

from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState, JobStatus
from cloudtrain.progress import Progress
from cloudtrain.show.reprs import job_html, status_html
from cloudtrain.spec.model import validate_spec


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quick_work_prints_nothing() -> None:
    out = io.StringIO()
    with Progress("staging", total=100, stream=out) as bar:
        bar.advance(100)
    assert out.getvalue() == ""


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("staging s3://b/x", total=2_000_000, stream=out, quiet=0.05, every=60) as bar:
        bar.advance(1_000_000)
        time.sleep(0.08)
        bar.advance(500_000)  # past the quiet time: the first line
        bar.advance(250_000)  # within `every` of it: nothing
        bar.advance(250_000)
    lines = out.getvalue().splitlines()
    assert lines[0] == "staging s3://b/x:  75% 1.5 MB/2.0 MB"
    assert lines[1].startswith("staging s3://b/x: 100% 2.0 MB/2.0 MB (") and len(lines) == 2
    assert "\r" not in out.getvalue() and "\033" not in out.getvalue()


def test_one_redrawn_line_on_a_terminal() -> None:
    out = Terminal()
    with Progress("bundling", total=4, unit="files", stream=out, quiet=0) as bar:
        for _ in range(4):
            bar.advance()
            time.sleep(0.11)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("bundling: 100% 4/4\033[K\n")
    assert "\r[######" in text and "\r[########################] bundling: 100%" in text


def test_html_reprs_escape_what_they_show() -> None:
    status = JobStatus(JobHandle("local", "x-1"), "x", JobState.FAILED, message="<script>alert(1)</script>",
                       details={"note": "a<b"})
    html = status_html(status)
    assert "<script>" not in html and "&lt;script&gt;" in html and "a&lt;b" in html
    assert ">failed<" in html  # the state badge
    spec = validate_spec({"script": "train.py", "env": {"WANDB_API_KEY": "sekrit-value", "MODE": "<fast>"}})
    shown = job_html(spec)
    assert "sekrit-value" not in shown and "&lt;fast&gt;" in shown and "train.py" in shown
