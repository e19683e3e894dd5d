"""Rich representations for Jupyter: a Job, a Plan and a Run render as small HTML tables (text elsewhere).
Everything shown is escaped, and a plan's environment is masked as in `cloudtrain plan`.

Plan and JobStatus are data in lower layers; their ``_repr_html_`` (and JobStatus's ``__str__``: what
`cloudtrain status` prints) is attached here, from above, when the SDK (which
notebooks import) loads this module: nothing below points up at it. ``RunStatus`` (what ``Run.status()`` returns)
prints all of what `cloudtrain status HANDLE` prints: the job's progress, goodput and lineage too."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cloudtrain.job_types import JobStatus
from cloudtrain.plan.model import Plan
from cloudtrain.show.formatting import estimate_text, size, status_text, watchdog_text

if TYPE_CHECKING:
    from cloudtrain.spec.model import JobSpec

_STATE_COLOURS = {"succeeded": "#1a7f37", "running": "#0969da", "pending": "#9a6700", "stopping": "#9a6700",
                  "failed": "#cf222e", "cancelled": "#57606a", "preempted": "#9a6700"}


def table(title: str, rows: Iterable[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
                   f"<td style='text-align:left'>{v if isinstance(v, Markup) else html.escape(str(v))}</td></tr>"
                   for k, v in rows)
    return f"<div><strong>{html.escape(title)}</strong><table>{body}</table></div>"


class Markup(str):
    """HTML built here (already escaped), inserted as is."""


def badge(state: str) -> Markup:
    colour = _STATE_COLOURS.get(state, "#57606a")
    return Markup(f"<span style='color:{colour};font-weight:bold'>{html.escape(state)}</span>")


def spec_rows(spec: JobSpec) -> list[tuple[str, Any]]:
    from cloudtrain.node.durations import format_duration
    from cloudtrain.node.secret_values import redact

    rows: list[tuple[str, Any]] = [
        ("entry", spec.script or f"-m {spec.module}"), ("source", spec.source_dir),
        ("layout", f"{spec.nodes} node(s) x {spec.procs_per_node} process(es), {spec.strategy}"),
        ("accelerator", spec.accelerator or "none (CPU)"), ("spot", spec.spot),
        ("max runtime", format_duration(spec.max_runtime)), ("checkpoint", spec.checkpoint.uri or "-")]
    if spec.env:
        rows.append(("env", " ".join(f"{k}={v}" for k, v in redact(dict(spec.env)).items())))
    return rows


def job_html(spec: JobSpec) -> str:
    return table(f"Job {spec.name}", spec_rows(spec))


def job_text(spec: JobSpec) -> str:
    """The rows of ``job_html`` as aligned text, for ``print(job)`` outside Jupyter."""
    rows = spec_rows(spec)
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"Job {spec.name}", *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def plan_html(plan: Plan) -> str:
    machine = plan.machine
    rows: list[tuple[str, Any]] = [
        ("provider", plan.provider), ("job", plan.job_id),
        ("instance", f"{machine.instance_type} ({machine.accelerator})" if machine else "this machine"),
        ("image", plan.image or "this machine's Python"),
        ("world size", f"{plan.spec.nodes} x {plan.nproc_per_node} = {plan.spec.nodes * plan.nproc_per_node}"
         if plan.nproc_per_node else f"{plan.spec.nodes} x one per GPU of the node (only known on the node)"),
        ("package", f"{len(plan.package.files)} files, {size(plan.package.bundle_bytes)}, "
                    f"{plan.package.digest[:19]}"),
        ("hang watchdog", watchdog_text(plan.spec)),
        ("estimate", Markup("<br>".join(html.escape(t) for t in estimate_text(plan.estimate)))),
        ("node 0", " ".join(plan.nodes[0].torchrun[1:])),
        *[("note", n) for n in plan.notes]]
    return table(f"Plan for {plan.provider}", rows)


def status_html(status: JobStatus) -> str:
    def when(ts: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"

    rows: list[tuple[str, Any]] = [("state", badge(status.state.value)), ("message", status.message or "-"),
                                   ("created", when(status.created_at)), ("started", when(status.started_at)),
                                   ("ended", when(status.ended_at))]
    rows += [(k, v) for k, v in status.facts().items() if v is not None and not isinstance(v, (list, dict))]
    return table(f"Run {status.handle}", rows)


class RunStatus(JobStatus):
    """A job's status as ``Run.status()`` reads it: a ``JobStatus`` (every field, ``to_dict()``, the same) whose
    ``str()`` and ``repr()`` are what `cloudtrain status HANDLE` prints, its progress, goodput and timeline notes
    included. Those are worked out from the job's timeline when first shown (its logs read then, not on every
    ``status()`` call), and kept: the status shown twice reads the same."""

    _provider: Any
    _shown: str | None

    @classmethod
    def of(cls, status: JobStatus, provider: Any) -> RunStatus:
        made = cls.__new__(cls)
        made.__dict__.update(vars(status))
        made._provider, made._shown = provider, None
        return made

    def __str__(self) -> str:
        shown, provider = getattr(self, "_shown", None), getattr(self, "_provider", None)
        if shown is None and provider is None:  # made another way (dataclasses.replace): its status only
            return status_text(self)
        if shown is None:
            from cloudtrain.errors import CloudtrainError
            from cloudtrain.show.metrics import status_page, story  # when shown: status() itself stays light

            try:
                shown = self._shown = status_page(self, story(provider, self.handle, self))
            except CloudtrainError as exc:  # its status still shows; why its story does not, after it
                return f"{status_text(self)}\n(progress and goodput unavailable: {exc.message})"
        return shown

    __repr__ = __str__


def status_str(status: JobStatus) -> str:
    """``print(status)``: the summary `cloudtrain status` prints."""
    return status_text(status)


Plan._repr_html_ = plan_html  # type: ignore[attr-defined]
JobStatus._repr_html_ = status_html  # type: ignore[attr-defined]
JobStatus.__str__ = status_str  # type: ignore[method-assign,assignment]
