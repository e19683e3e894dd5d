"""How results look on the terminal: short human text by default, one JSON/YAML document with --output. What the
SDK shows too (plans, statuses, figures) is in cloudtrain/show/formatting.py; this module adds what only the CLI prints.
Colour only where ``colour=True`` (the CLI passes it for a TTY; see formatting.colour_enabled)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from cloudtrain.show.formatting import (
    _when,
    columns,
    estimate_text,
    money,
    plan_text,
    size,
    state,
    status_text,
)

if TYPE_CHECKING:
    from cloudtrain.job_types import JobStatus
    from cloudtrain.plan.compare import Comparison
    from cloudtrain.platforms.catalog import Machine
    from cloudtrain.spec.settings import Setting


__all__ = ["catalog_text", "checkpoints_text", "columns",
           "compare_text", "cost_text", "emit", "estimate_text", "money", "plan_text",
           "preempt_text", "settings_text",
           "size", "status_text", "table"]


def emit(data: Any, fmt: str) -> None:
    if fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")



def preempt_text(status: JobStatus) -> str:
    """What `cloudtrain preempt` did, and what will follow: a restart that resumes, or the end of the job."""
    nodes = [n for n in status.nodes or [] if n.get("exit_code") is None]
    restarts, most = status.restarts or 0, status.max_restarts or 0
    lines = [f"sent SIGTERM to {len(nodes)} node(s) of {status.handle}, as a spot interruption would"]
    resumes = status.restart_resumes or "from its newest checkpoint"
    if restarts < most:
        # what the store holds now; a save its nodes finish as they stop is published only if it is whole
        lines.append(f"it restarts (restart {restarts + 1} of {most}) and resumes {resumes}, or from a newer "
                     "checkpoint if its nodes publish one as they stop"
                     if not resumes.startswith("from scratch") else
                     f"it restarts (restart {restarts + 1} of {most}) {resumes}, unless its nodes publish one as "
                     "they stop (`cloudtrain status` says)")
    elif most:
        lines.append(f"no restarts left ({restarts} of {most} used): the job will end 'preempted'")
    else:
        lines.append("max_restarts is 0: the job will end 'preempted'. To rehearse a restart that resumes, submit "
                     "with --max-restarts 1 (and a --checkpoint-uri to resume from)")
    return "\n".join(lines)


def checkpoints_text(found: dict[str, Any], colour: bool = False) -> str:
    """`cloudtrain checkpoints`: one row per step folder, newest first, and which one a restore takes."""
    rows = [("STEP", "STATE", "FILES", "SIZE", "PUBLISHED", "LINEAGE", "WHY")]
    for row in found["checkpoints"]:
        mark = " *" if row["step"] == found["resumes"] and row["state"] == "usable" else ""
        rows.append((str(row["step"]), row["state"] + mark, "-" if row["files"] is None else str(row["files"]),
                     "-" if row["bytes"] is None else size(row["bytes"]), _when(row["created"]),
                     row["lineage"] or "-", row["why"] or ""))
    if len(rows) == 1:
        return f"no checkpoint under {found['uri']}"
    resumes = f"checkpoint {found['resumes']} (*)" if found["resumes"] is not None else "from scratch (none usable)"
    return "\n".join([columns(rows, colour), "", f"{found['uri']}: a restore takes {resumes}; one set aside is never "
                      "restored nor deleted (submit --restore-from N picks any checkpoint on purpose)"])


def table(statuses: list[JobStatus], colour: bool = False) -> str:
    if not statuses:
        return "no jobs"
    rows = [("HANDLE", "STATE", "CREATED", "MESSAGE")]
    rows += [(str(s.handle), s.state.value, _when(s.created_at), s.message[:60]) for s in statuses]
    text = columns(rows, colour)
    if colour:  # colour the state words after aligning (escape codes have no width)
        lines = text.split("\n")
        for n, s in enumerate(statuses, start=1):
            lines[n] = lines[n].replace(f"  {s.state.value}", f"  {state(s.state.value, True)}", 1)
        text = "\n".join(lines)
    return text


def catalog_text(machines: list[Machine], colour: bool = False) -> str:
    """The catalog as a table; '~' marks a price recalled rather than read from a price list."""
    from cloudtrain.platforms.catalog import price_source

    rows = [("PROVIDER", "INSTANCE", "GPUS", "GPU MEM", "VCPUS", "ON-DEMAND/H", "SPOT/H")]
    for m in machines:
        mark = "~" if m.confidence == "recalled" else ""
        rows.append((m.provider, m.instance_type, m.accelerator, f"{m.gpu_memory_gb:g} GB" if m.gpu_memory_gb else "-",
                     str(m.vcpus or "-"), mark + money(m.on_demand) if m.on_demand is not None else "-",
                     mark + money(m.spot) if m.spot is not None else "-"))
    if len(rows) == 1:
        return "no machine matches"
    lines = [columns(rows, colour), ""]
    for provider in dict.fromkeys(m.provider for m in machines):
        src = price_source(provider)
        lines.append(f"{provider}: {src.region} list prices as of {src.as_of}, USD per node-hour, estimates. "
                     f"Source: {src.source}")
        lines.append(f"  spot: {src.spot_note}")
    lines.append("~ recalled figure (less certain than one read from a price list); - not known")
    return "\n".join(lines)


def settings_text(provider: str, settings: list[Setting], colour: bool = False) -> str:
    def shown(value: Any) -> str:  # a list as subnet-a,subnet-b, not as Python prints it
        if value is None or value == []:
            return "-"
        return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)

    rows = [("SETTING", "VALUE", "SOURCE")]
    rows += [(s.key, shown(s.value), s.source) for s in settings]
    return columns(rows, colour)


def compare_text(found: Comparison, colour: bool = False) -> str:
    """`plan --compare`: one row per provider (and region), cheapest first, and what each needs before submit."""
    from cloudtrain.node.durations import format_duration

    spec = found.spec
    rows = [("PROVIDER", "REGION", "INSTANCE", "GPUS", "ON-DEMAND/H", "SPOT/H",
             f"EST. {format_duration(spec.max_runtime)}", "TO SUBMIT")]
    for r in found.rows:
        billed = r.billed_as == "spot" and r.spot is not None
        rows.append((r.provider, r.region or "-", r.instance or "-", r.gpus or "-",
                     money(r.on_demand) + ("" if billed or r.on_demand is None else "*"),
                     money(r.spot) + ("*" if billed else ""), money(r.estimate), r.status))
    lines = [columns(rows, colour), "",
             f"{spec.nodes} node(s); * the rate billed; EST.: max_runtime at that rate. List prices in one region per "
             "provider (`cloudtrain catalog`), compute only: estimates."]
    if spec.max_cost is not None:
        lines.append(f"max_cost {money(spec.max_cost)}: rows it buys less than an hour of cannot run")
    return "\n".join(lines)


def cost_text(found: dict[str, Any], colour: bool = False) -> str:
    """`cloudtrain cost`: each leg's runtime and cost, then the total, restarts and spot savings."""
    from cloudtrain.node.durations import format_duration

    rows = [("LEG", "STATE", "RUNTIME", "NODES", "RATE/NODE-H", "COST", "ON-DEMAND")]
    for leg in found["legs"]:
        rows.append((leg["handle"], leg["state"] or "-", format_duration(round(leg["hours"] * 3600)) or "0s",
                     str(leg["nodes"] or "-"),
                     money(leg["per_node_hour"]) + (f" {leg['capacity'].replace('_', '-')}" if leg["capacity"] else ""),
                     money(leg["cost"]), money(leg["on_demand_cost"])))
    lines = [columns(rows, colour), ""]
    lines.append(f"total {money(found['cost'])} over {format_duration(round(found['hours'] * 3600)) or '0s'} and "
                 f"{found['restarts']} restart(s); on-demand would be {money(found['on_demand_cost'])}, spot saved "
                 f"{money(found['spot_savings'])}")
    if found["max_cost"] is not None:
        left = max(0.0, found["max_cost"] - found["cost"])
        lines.append(f"budget {money(found['max_cost'])}: {money(left)} left")
    if found["stopped"]:
        lines.append(found["stopped"])
    if found["unpriced"]:
        lines.append(f"no price known for {', '.join(found['unpriced'])} (submitted from another machine, or a "
                     "provider without list prices): counted as $0")
    if found.get("problems"):
        lines.append(f"{len(found['problems'])} cost record(s) not used: the warning(s) above say why and the fix")
    lines.append("list prices x nodes x wall time per leg: an estimate, compute only, never a bill")
    return "\n".join(lines)
