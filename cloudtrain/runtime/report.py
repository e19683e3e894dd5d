"""``report_step(step, total=None)``: the one line a training script adds so `cloudtrain status` shows its progress
(step, steps/s, ETA) and goodput. Cheap to call after every step: it prints an event (cloudtrain/node/events.py) at
most every couple of seconds, from rank 0 only."""

from __future__ import annotations

from cloudtrain.node.events import StepReporter

_reporter: StepReporter | None = None


def report_step(step: int, total: int | None = None, data_s: float | None = None) -> None:
    """Tell cloudtrain the step just finished (``total``: the steps the run will take, where known: status then
    shows an ETA; ``data_s``: the seconds this step waited for its batch, where the script measures it: goodput
    then counts them as data loading)."""
    global _reporter
    if _reporter is None:
        _reporter = StepReporter()
    _reporter.report(step, total, data_s)
