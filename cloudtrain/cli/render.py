"""How results look on the terminal: short human text by default, one JSON/YAML document with --output."""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cloudtrain.plan import Plan
    from cloudtrain.providers.base import JobStatus


def emit(data: Any, fmt: str) -> None:
    if fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def plan_text(plan: Plan) -> str:
    spec = plan.spec
    pkg = plan.package
    nproc = plan.nproc_per_node
    lines = [
        f"provider     {plan.provider}",
        f"job          {plan.job_id}",
        f"layout       {spec.nodes} node(s) x {nproc} process(es) = world size {spec.nodes * nproc}, "
        f"strategy {spec.strategy}",
        f"accelerator  {spec.accelerator or 'none (CPU)'}",
        f"spot         {'yes' if spec.spot else 'no'}",
        f"checkpoint   {spec.checkpoint.uri or 'none'}",
        f"package      {len(pkg.files)} files, {_size(pkg.source_bytes)} source, {_size(pkg.bundle_bytes)} bundle, "
        f"{pkg.digest[:19]}",
        f"staged at    {plan.staging.get('prefix', '-')}",
    ]
    for node in plan.nodes[:2]:
        lines.append(f"node {node.rank}       {shlex.join(node.torchrun[1:])}")
    if len(plan.nodes) > 2:
        lines.append(f"...          {len(plan.nodes) - 2} more node(s), same command with their own rank")
    lines += [f"note         {n}" for n in plan.notes]
    lines += ["", "request:", json.dumps(plan.to_dict()["request"], indent=2)]  # redacted
    return "\n".join(lines)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def status_text(status: JobStatus) -> str:
    lines = [f"{status.handle}  {status.state.value}" + (f"  ({status.message})" if status.message else "")]
    lines.append(f"  created {_when(status.created_at)}  started {_when(status.started_at)}  "
                 f"ended {_when(status.ended_at)}")
    scalars = {k: v for k, v in status.details.items() if v is not None and not isinstance(v, (list, dict))}
    if scalars:
        lines.append("  " + "  ".join(f"{k} {v}" for k, v in scalars.items()))
    for node in status.details.get("nodes", []):
        code = node.get("exit_code")
        lines.append(f"  node {node['rank']}: pid {node.get('pid')}  "
                     + (f"exit {code} ({node.get('outcome')})" if code is not None else "running")
                     + f"  log {node.get('log')}")
    return "\n".join(lines)


def table(statuses: list[JobStatus]) -> str:
    rows = [("HANDLE", "STATE", "CREATED", "MESSAGE")]
    rows += [(str(s.handle), s.state.value, _when(s.created_at), s.message[:60]) for s in statuses]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in rows
    )
