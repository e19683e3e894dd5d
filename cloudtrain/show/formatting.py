"""How plans, statuses and figures read as text, for people: the CLI prints it, a notebook shows it, ``print(plan)``
returns it. Below the CLI and the SDK (both use it), above nothing but the plan and spec data it formats. Colour only
where ``colour=True`` (a TTY: see colour_enabled), never in pipes, files or CI logs (https://no-color.org)."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from cloudtrain import registry
from cloudtrain.job_types import Summary
from cloudtrain.node.durations import format_duration
from cloudtrain.plan.model import Plan

if TYPE_CHECKING:
    from cloudtrain.job_types import JobStatus
    from cloudtrain.spec.model import JobSpec

_CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2"}
STATE_COLOURS = {"succeeded": "green", "running": "blue", "pending": "yellow", "stopping": "yellow",
                 "failed": "red", "cancelled": "dim", "preempted": "yellow", "ok": "green", "warn": "yellow",
                 "missing": "red"}


def colour_enabled(stream: TextIO) -> bool:
    """https://no-color.org, FORCE_COLOR for tools that capture a terminal, else only a TTY that isn't 'dumb'."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def paint(text: str, colour: str, enabled: bool) -> str:
    return f"\033[{_CODES[colour]}m{text}\033[0m" if enabled and colour in _CODES else text


def state(text: str, enabled: bool) -> str:
    """A job state (or a check's status) in its colour."""
    return paint(text, STATE_COLOURS.get(text, "bold"), enabled)


def size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def columns(rows: Sequence[Sequence[str]], colour: bool = False) -> str:
    """Left-aligned columns under a bold header row; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for n, row in enumerate(rows):
        line = "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        lines.append(paint(line.rstrip(), "bold", colour and n == 0))
    return "\n".join(lines)


def estimate_text(estimate: dict[str, Any] | None) -> list[str]:
    """The estimate as one or two lines: billed rate first, then the other rate, and the max_runtime bound."""
    if not estimate:
        return ["none (runs on this machine)"]
    if not estimate.get("available"):
        return [f"unavailable: {estimate['reason']}"]
    billed = estimate["billed_as"]
    hours = estimate["max_runtime_hours"]
    parts = []
    for kind in ("on_demand", "spot"):
        rate = estimate.get(kind)
        label = kind.replace("_", "-")
        if rate:
            parts.append(f"{label} {money(rate['hourly'])}/h, up to {money(rate['max_runtime'])} in "
                         f"{format_duration(hours * 3600)}"
                         + (" (billed)" if kind == billed else ""))
        elif kind == "spot":
            parts.append("spot: no list price" + (" (billed)" if billed == "spot" else ""))
    lines = ["; ".join(parts)]
    lines.append(f"{estimate['nodes']} node(s) x {estimate['instance_type']}, {estimate['price_region']} list prices "
                 f"as of {estimate['as_of']}: an estimate, compute only")
    for key in ("capacity_note", "region_note"):
        if estimate.get(key):
            lines.append(estimate[key])
    return lines


def budget_text(budget: dict[str, Any]) -> str:
    """What max_cost buys: hours of this job's nodes at on-demand and at spot prices, and who holds it."""
    def hours(value: float | None) -> str | None:
        return None if value is None else format_duration(max(1, round(value * 3600)))

    bought = [f"{label} {hours(budget[key])}" + (" (billed)" if budget["billed_as"] == kind else "")
              for label, key, kind in (("on-demand", "on_demand_hours", "on_demand"), ("spot", "spot_hours", "spot"))
              if budget.get(key) is not None]
    held = (f"; max_runtime is capped at {format_duration(budget['runtime_cap'])}, so the platform stops it even "
            "when nothing watches it" if budget.get("runtime_cap") else "")
    return (f"{money(budget['max_cost'])} buys {', '.join(bought)} of this job's nodes; the watcher (a foreground "
            f"submit, wait --recover) stops the job with a final checkpoint there{held}")


def watchdog_text(spec: JobSpec) -> str:
    """What a plan says about the hang watchdog (max_idle, on unless 'off')."""
    if not spec.max_idle:
        return "no hang watchdog (max_idle: off)"
    return f"stopped as hung after {format_duration(spec.max_idle)} without output, checkpoint or CPU use (max_idle)"


def plan_text(plan: Plan, colour: bool = False, request: bool = True) -> str:
    """A summary to read before paying, then (``request``) the provider-native request (secrets masked)."""
    from cloudtrain.node.secret_values import redact

    spec = plan.spec
    pkg = plan.package
    nproc = plan.nproc_per_node
    summary = provider_summary(plan)
    machine = plan.machine
    if machine is not None:
        if machine.gpu:
            memory = f" {machine.gpu_memory_gb:g} GB" if machine.gpu_memory_gb else ""
            gpus = f"{machine.gpus} x {machine.gpu}{memory}"
        elif machine.vcpus is None:  # an explicit type cloudtrain has no data for: say so, not "no GPU"
            gpus = "not in cloudtrain's catalog" + (f"; {machine.gpus} process(es) per node" if machine.gpus else "")
        else:
            gpus = "no GPU"
        instance = f"{machine.instance_type} ({gpus})"
    else:
        instance = summary.instance or "the machine the platform picks"

    def row(label: str, value: str) -> str:
        return f"{paint(label.ljust(12), 'bold', colour)} {_unset(value, plan.provider)}"

    lines = [
        row("provider", plan.provider),
        row("job", f"{plan.job_id} (each submit names its job anew; `submit --plan` a plan saved with -o json "
                   "keeps this id)"),
        *([row("spec", f"{plan.spec_file} (with the flags given, which override it)")] if plan.spec_file else []),
        row("layout", (f"{spec.nodes} node(s) x {nproc} process(es) = world size {spec.nodes * nproc}" if nproc else
                       f"{spec.nodes} node(s) x one process per GPU of the node (only known on the node)")
            + f", strategy {spec.strategy}"),
        *([row("where", summary.where)] if summary.where else []),
        row("instance", instance),
        row("image", plan.image or "this machine's Python and torch"),
        row("each node", plan.runtime.summary() if plan.runtime else "the torch and Python the nodes have (only known "
                                                                     "there)"),
        row("spot", _spot(plan, summary.max_wait)),
        row("max runtime", f"{format_duration(spec.max_runtime)}, {watchdog_text(spec)}"),
        row("checkpoint", spec.checkpoint.uri or "none"),
        row("package", f"{len(pkg.files)} files, {size(pkg.source_bytes)} source, {size(pkg.bundle_bytes)} bundle, "
                       f"{pkg.digest[:19]}"),
        row("staged at", plan.staging.get("prefix") or plan.staging.get("upload") or "-"),
    ]
    for n, text in enumerate(estimate_text(plan.estimate)):
        lines.append(row("estimate" if n == 0 else "", text))
    if plan.budget:
        lines.append(row("budget", budget_text(plan.budget)))
    if spec.env:
        masked = redact(dict(spec.env))
        lines.append(row("env", " ".join(f"{k}={v}" for k, v in masked.items())))
    for node in plan.nodes[:2]:
        lines.append(row(f"node {node.rank}", shlex.join(node.torchrun[1:])))
    if len(plan.nodes) > 2:
        lines.append(row("...", f"{len(plan.nodes) - 2} more node(s), same command with their own rank"))
    lines += [row("note", paint(n, "yellow", colour)) for n in plan.notes]
    if request:
        lines += ["", paint("request:", "bold", colour), json.dumps(plan.to_dict()["request"], indent=2)]  # redacted
    return "\n".join(lines)


def _spot(plan: Plan, wait: int | None) -> str:
    """Spot or not; for spot, the restarts and max_wait (the time a platform waits for capacity plus runs), where
    the platform uses one (``wait``: what its summary hook says it will use, default included)."""
    spec = plan.spec
    if not spec.spot:
        return "no"
    parts = ["yes", f"up to {spec.max_restarts} restart(s)" if spec.max_restarts else "no restarts (max_restarts 0)"]
    if wait:
        parts.append(f"max_wait {format_duration(wait)} (capacity wait plus run time)")
    elif spec.max_wait:
        parts.append(f"max_wait {format_duration(spec.max_wait)} (not used by {plan.provider})")
    return ", ".join(parts)


def _unset(text: str, provider: str) -> str:
    """A setting's placeholder (its provider's ``placeholders``) shown as what it is: not set."""
    for key, marker in registry.declaration(provider).placeholders.items():
        text = text.replace(marker, f"<providers.{provider}.{key} not set>")
    return text


def provider_summary(plan: Plan) -> Summary:
    """The provider's own part of the summary (its ``plan_summary`` hook), or nothing."""
    decl = registry.declaration(plan.provider)
    return decl.load("plan_summary")(plan) if decl.plan_summary else Summary()


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


# a status detail: what a restart starts from (cloudtrain.checkpoint.restore.resume_point)
RESTART_RESUMES = "restart_resumes"


def status_text(status: JobStatus, colour: bool = False) -> str:
    lines = [f"{status.handle}  {state(status.state.value, colour)}"
             + (f"  ({status.message})" if status.message else "")]
    lines.append(f"  created {_when(status.created_at)}  started {_when(status.started_at)}  "
                 f"ended {_when(status.ended_at)}")
    scalars = {k: v for k, v in status.facts().items() if v is not None and not isinstance(v, (list, dict))
               and k != RESTART_RESUMES}
    if scalars:
        lines.append("  " + "  ".join(f"{k} {v}" for k, v in scalars.items()))
    if status.restart_resumes:
        lines.append(f"  a restart resumes {status.restart_resumes}")
    for node in status.nodes or []:
        code = node.get("exit_code")
        lines.append(f"  node {node['rank']}: pid {node.get('pid')}  "
                     + (f"exit {code} ({node.get('outcome')})" if code is not None else "running")
                     + f"  log {node.get('log')}")
        for key in ("reason", "note", "hint"):  # what the node said about itself, unless the message says it
            if node.get(key) and node[key] not in status.message:
                lines.append(f"    {node[key]}")
        lines += [f"    warning: {line}" for line in node.get("warnings") or []]
    return "\n".join(lines)


def _plan_str(plan: Plan) -> str:
    """The summary `cloudtrain plan` prints (without the request): ``print(plan)``."""
    return plan_text(plan, request=False)


Plan.__str__ = _plan_str  # type: ignore[method-assign,assignment]  # attached from above: Plan is data below
