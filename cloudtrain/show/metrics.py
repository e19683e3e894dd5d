"""What `status` adds to a job's state: its timeline, progress and goodput (``story``), as lines for the text status
and as OpenMetrics (`status -o openmetrics`: the Prometheus exposition format, for the tools people already run)."""

from __future__ import annotations

import sys
from typing import Any

from cloudtrain.home import goodput, timeline
from cloudtrain.show.goodput import text as goodput_text

STATES = ("pending", "running", "stopping", "succeeded", "failed", "cancelled", "preempted")


def story(provider: Any, handle: Any, status: Any) -> dict[str, Any]:
    """``{"progress", "goodput", "timeline"}`` of one job (``status -o json`` carries them as they are). A job that
    recovery resubmitted counts its earlier submissions too (its chain up to this one): their legs, the steps redone
    after each restore, their cost; the timeline is then the chain's, with ``chain`` naming its handles."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.jobs.submitted import chain_of
    from cloudtrain.plan.checkpoint_interval import remember
    from cloudtrain.plan.cost import rate_from, recorded
    from cloudtrain.providers import get_provider

    chain = chain_of(handle)
    chain = chain[:chain.index(str(handle)) + 1] if str(handle) in chain else [str(handle)]
    earlier = [_earlier(JobHandle.parse(h), get_provider) for h in chain[:-1]]
    found = timeline.read(provider, handle)
    parts = []
    for k, (h, told) in enumerate(earlier):
        following = (earlier[k + 1][1] if k + 1 < len(earlier) else found)["events"]
        next_submitted = next((e["t"] for e in following if e["e"] == "submitted"), None)
        parts.append((told["events"], goodput.Ended.of(told["events"], next_submitted), rate_from(recorded(str(h)))))
    parts.append((found["events"], status, rate_from(recorded(str(handle)))))
    figures = goodput.summarise_chain(parts)
    # what checkpoint.interval: auto plans the next run of the job with: a chain's figures under its first job
    remember(JobHandle.parse(chain[0]).job_id, figures["goodput"])
    if earlier:
        events = sorted([e for _, told in earlier for e in told["events"]] + found["events"], key=lambda e: e["t"])
        found = {**found, "events": events, "chain": chain,
                 "missing": found["missing"] + sum(told["missing"] for _, told in earlier),
                 "logs": found["logs"] or next((told["logs"] for _, told in earlier if told["logs"]), None)}
    return {**figures, "timeline": found}


def _earlier(handle: Any, get_provider: Any) -> tuple[Any, dict[str, Any]]:
    """An earlier submission's timeline; one on a provider this machine cannot load now (its extra not installed)
    keeps the home's own events of it, and says why its nodes' are missing."""
    from cloudtrain.errors import CloudtrainError

    try:
        provider = get_provider(handle.provider)
    except CloudtrainError as exc:
        events, missing = timeline.own_events(str(handle))
        return handle, {"events": events, "missing": missing,
                        "logs": f"the nodes' events of {handle} are not known: {exc.message}"}
    return handle, timeline.read(provider, handle)


def status_lines(found: dict[str, Any]) -> list[str]:
    lines = goodput_text(found)
    told = found["timeline"]
    said = timeline.empty_folder(told["events"])
    if said:
        lines.append(f"warning: {said}")
    if told["missing"]:
        lines.append(f"timeline: {told['missing']} event line(s) cut short or unreadable are missing from it")
    if told["logs"]:
        lines.append(f"timeline: {told['logs']}")
    return lines


def job_figures(handle_text: str | None) -> list[tuple[Any, dict[str, Any]]]:
    """(status, story) of the job named, or of every job this home has a timeline for. A job of the list whose
    status cannot be read now is left out, said on stderr; one named that cannot be read is the command's error."""
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.handles import JobHandle
    from cloudtrain.providers import get_provider

    out = []
    for text in [handle_text] if handle_text else timeline.known_handles():
        try:
            handle = JobHandle.parse(text)
            provider = get_provider(handle.provider)
            status = provider.describe(handle)
        except CloudtrainError as exc:
            if handle_text:
                raise
            print(f"cloudtrain: warning: {text} left out: {exc.message}", file=sys.stderr)
            continue
        out.append((status, story(provider, handle, status)))
    return out


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def exposition(jobs: list[tuple[Any, dict[str, Any]]]) -> str:
    """OpenMetrics text: one family per figure, a sample per job (labelled by handle), ``# EOF`` last."""
    families: list[tuple[str, str, str, str, list[tuple[str, dict[str, Any], float]]]] = [
        ("cloudtrain_job_state", "stateset", "", "The job's state", []),
        ("cloudtrain_job_step", "gauge", "", "The newest training step the job reported or checkpointed", []),
        ("cloudtrain_job_steps_per_second", "gauge", "", "Training steps per second in the current leg", []),
        ("cloudtrain_job_restarts", "counter", "", "Restarts of the job after preemptions or failures", []),
        ("cloudtrain_job_preemptions", "counter", "", "Preemptions of the job's nodes", []),
        ("cloudtrain_job_checkpoint_age_seconds", "gauge", "seconds", "Seconds since the newest committed checkpoint",
         []),
        ("cloudtrain_job_checkpoint_interval_seconds", "gauge", "seconds", "The checkpoint interval the job runs with",
         []),
        ("cloudtrain_job_goodput_ratio", "gauge", "ratio", "Kept training time over paid node time", []),
        ("cloudtrain_job_paid_seconds", "counter", "seconds", "Node time paid for (wall time of the job's legs)", []),
        ("cloudtrain_job_lost_seconds", "counter", "seconds", "Paid or waited time that kept no work, by cause", []),
        ("cloudtrain_job_cost_usd", "counter", "", "Cost so far at the job's price, USD", []),
    ]
    by_name = {f[0]: f[4] for f in families}
    for status, found in jobs:
        job = {"handle": str(status.handle), "name": status.name}
        p, g = found["progress"], found["goodput"]
        for state in STATES:
            by_name["cloudtrain_job_state"].append(("", {**job, "cloudtrain_job_state": state},
                                                    int(status.state.value == state)))

        def add(name: str, value: Any, suffix: str = "", **labels: Any) -> None:
            if value is not None:
                by_name[name].append((suffix, {**job, **labels}, value))  # noqa: B023 - used at once

        add("cloudtrain_job_step", p["step"])
        add("cloudtrain_job_steps_per_second", p["steps_per_s"])
        add("cloudtrain_job_restarts", status.restarts or 0, "_total")
        add("cloudtrain_job_preemptions", g["preemptions"], "_total")
        add("cloudtrain_job_checkpoint_age_seconds", g["checkpoint_age_s"])
        add("cloudtrain_job_checkpoint_interval_seconds", g.get("checkpoint_interval_s"))
        add("cloudtrain_job_goodput_ratio", g["ratio"])
        add("cloudtrain_job_paid_seconds", g["paid_s"], "_total")
        for cause, seconds in g["losses_s"].items():
            add("cloudtrain_job_lost_seconds", seconds, "_total", cause=cause)
        add("cloudtrain_job_cost_usd", g["cost_usd"], "_total")
    lines = []
    for name, kind, unit, help_text, samples in families:
        lines += [f"# TYPE {name} {kind}", f"# HELP {name} {help_text}"] + ([f"# UNIT {name} {unit}"] if unit else [])
        for suffix, labels, value in samples:
            shown = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{suffix}{{{shown}}} {_number(value)}")
    return "\n".join([*lines, "# EOF"]) + "\n"


def json_text(data: dict[str, Any]) -> str:
    """``status -o json``: indented as elsewhere, but the timeline's events one compact line each (json's C encoder
    does not indent: 10,000 events indented took longer than the rest of status)."""
    import json

    told = dict(data["timeline"])
    events = told.pop("events")
    head = json.dumps({**data, "timeline": told}, indent=2)
    assert head.endswith("\n  }\n}")  # the timeline is the last key, an object
    body = ",\n".join("      " + json.dumps(e) for e in events)
    return head[:-len("\n  }\n}")] + (',\n    "events": [\n' + body + "\n    ]" if events else ',\n    "events": []') \
        + "\n  }\n}\n"
