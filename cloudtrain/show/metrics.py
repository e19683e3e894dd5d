"""What `status` adds to a job's state: its timeline, progress and goodput (``story``), as lines for the text status
and as OpenMetrics (`status -o openmetrics`: the Prometheus exposition format, for the tools people already run)."""

from __future__ import annotations

import math
import sys
from typing import Any

from cloudtrain.home import event_schema, goodput, timeline
from cloudtrain.show.goodput import text as goodput_text

STATES = ("pending", "running", "stopping", "succeeded", "failed", "cancelled", "preempted")


def story(provider: Any, handle: Any, status: Any) -> dict[str, Any]:
    """``{"progress", "goodput", "timeline"}`` of one job (``status -o json`` carries them as they are). A job that
    recovery resubmitted counts its earlier submissions too (its chain up to this one): their legs, the steps redone
    after each restore, their cost; the timeline is then the chain's, with ``chain`` naming its handles."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.jobs.submitted import chain_of
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
    refused = event_schema.said(told.get("ignored") or {})
    if refused:
        lines.append(refused)
    if told["logs"]:
        lines.append(f"timeline: {told['logs']}")
    return lines


def read_status(provider: Any, handle: Any) -> Any:
    """A job's status as `cloudtrain status HANDLE` shows it: with the checkpoint a restart resumes from, and for a
    job recovery resubmitted or moved, its chain (where each leg ran and why it moved)."""
    from cloudtrain.jobs.recovery import load
    from cloudtrain.jobs.submitted import with_restart_point

    status = with_restart_point(provider.describe(handle))
    chain = load(handle)
    if chain is not None and (chain.legs or chain.restarts):
        status.recovery = {"chain": chain.chain, "restarts": chain.restarts, "history": chain.history}
    return status


def status_page(status: Any, found: dict[str, Any], colour: bool = False) -> str:
    """What `cloudtrain status HANDLE` prints of a job (``status`` as `status` reads it: restart point and recovery
    set), and ``print(run.status())`` too: its status, progress, goodput and timeline notes, and its lineage."""
    from cloudtrain.show.formatting import status_text

    lines = [status_text(status, colour), *status_lines(found)]
    if status.recovery:
        from cloudtrain.jobs.fallback import lineage_text

        lines += ["lineage:", *lineage_text(status.recovery["history"])]
    return "\n".join(lines)


def job_figures(handle_text: str | None) -> list[tuple[Any, dict[str, Any]]]:
    """(status, story) of the job named, or of every job this home has a timeline for, each once. A job of the list
    whose status or figures cannot be worked out now is left out, said on stderr (one job never voids the others);
    one named that cannot be read is the command's error."""
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.handles import JobHandle
    from cloudtrain.providers import get_provider

    if handle_text:
        handle = JobHandle.parse(handle_text)
        provider = get_provider(handle.provider)
        status = provider.describe(handle)
        return [(status, story(provider, handle, status))]
    out = []
    for text in dict.fromkeys(timeline.known_handles()):  # a copied events file names its job again
        try:
            handle = JobHandle.parse(text)
            provider = get_provider(handle.provider)
            status = provider.describe(handle)
            out.append((status, story(provider, handle, status)))
        except Exception as exc:  # whatever broke, it broke this job's figures only
            _left_out(text, exc.message if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}")
    return out


def _left_out(handle: Any, why: str) -> None:
    print(f"cloudtrain: warning: {handle} left out of the metrics: {why}", file=sys.stderr)


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: Any, counter: bool) -> str | None:
    """``value`` as OpenMetrics writes a number (ints as ints, floats as Python's shortest repr: ``1.5``,
    ``1e+21``), or None where it is no sample: not a number (text, a bool), not finite, or negative (a counter may
    not be; and none of cloudtrain's figures is: a step, a rate, seconds, a ratio, dollars)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past any float
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return str(value) if isinstance(value, int) else repr(number + 0.0)  # + 0.0: -0.0 written 0.0


FAMILIES: list[tuple[str, str, str, str]] = [  # name, type, unit, help
    ("cloudtrain_job_state", "stateset", "", "The job's state"),
    ("cloudtrain_job_step", "gauge", "", "The newest training step the job reported or checkpointed"),
    ("cloudtrain_job_steps_per_second", "gauge", "", "Training steps per second in the current leg"),
    ("cloudtrain_job_ideal_step_seconds", "gauge", "seconds",
     "Ideal seconds per training step (the mean of its step times, stragglers and pauses left out)"),
    ("cloudtrain_job_step_time_deviation_seconds", "gauge", "seconds",
     "How much slower than ideal the recent steps are, seconds per step"),
    ("cloudtrain_job_restarts", "counter", "", "Restarts of the job after preemptions or failures"),
    ("cloudtrain_job_preemptions", "counter", "", "Preemptions of the job's nodes"),
    ("cloudtrain_job_checkpoint_age_seconds", "gauge", "seconds", "Seconds since the newest committed checkpoint"),
    ("cloudtrain_job_checkpoint_interval_seconds", "gauge", "seconds", "The checkpoint interval the job runs with"),
    ("cloudtrain_job_goodput_ratio", "gauge", "ratio", "Kept training time over paid node time"),
    ("cloudtrain_job_paid_seconds", "counter", "seconds", "Node time paid for (wall time of the job's legs)"),
    # gauges, not counters: a cause's seconds settle as the job goes on (the time since the last step report is
    # "other" until the next report makes it kept work), so they may go down, which a counter may not
    ("cloudtrain_job_lost_seconds", "gauge", "seconds",
     "Paid or waited time that kept no work so far, by cause (may go down as the newest leg's figures settle)"),
    ("cloudtrain_job_cost_usd", "counter", "", "Cost so far at the job's price, USD"),
    ("cloudtrain_job_events_ignored", "gauge", "",
     "Event lines of the job's timeline refused (malformed, forged, out of the job's life) in the logs read now"),
]
_COUNTERS = {name for name, kind, _, _ in FAMILIES if kind == "counter"}


def _samples(status: Any, found: dict[str, Any]) -> list[tuple[str, str]]:
    """(family, sample line) of one job; a figure that is no valid sample is left out (the job's others stay)."""
    job = {"handle": str(status.handle), "name": status.name}
    p, g, told = found["progress"], found["goodput"], found.get("timeline") or {}
    out = []

    def add(name: str, value: Any, **labels: Any) -> None:
        shown = _number(value, name in _COUNTERS)
        if shown is not None:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in {**job, **labels}.items())
            out.append((name, f"{name}{'_total' if name in _COUNTERS else ''}{{{text}}} {shown}"))

    for state in STATES:
        add("cloudtrain_job_state", int(status.state.value == state), cloudtrain_job_state=state)
    step_time = g.get("step_time_s") or {}
    add("cloudtrain_job_step", p["step"])
    add("cloudtrain_job_steps_per_second", p["steps_per_s"])
    add("cloudtrain_job_ideal_step_seconds", step_time.get("ideal"))
    add("cloudtrain_job_step_time_deviation_seconds", step_time.get("deviation"))
    add("cloudtrain_job_restarts", status.restarts or 0)
    add("cloudtrain_job_preemptions", g["preemptions"])
    add("cloudtrain_job_checkpoint_age_seconds", g.get("checkpoint_age_s"))
    add("cloudtrain_job_checkpoint_interval_seconds", g.get("checkpoint_interval_s"))
    add("cloudtrain_job_goodput_ratio", g["ratio"])
    add("cloudtrain_job_paid_seconds", g["paid_s"])
    for cause, seconds in g["losses_s"].items():
        add("cloudtrain_job_lost_seconds", seconds, cause=cause)
    add("cloudtrain_job_cost_usd", g["cost_usd"])
    add("cloudtrain_job_events_ignored", (told.get("ignored") or {}).get("count"))
    return out


def exposition(jobs: list[tuple[Any, dict[str, Any]]]) -> str:
    """OpenMetrics text: one family per figure, a sample per job (labelled by handle), ``# EOF`` last. A job whose
    figures are not of the shape expected is left out, said on stderr; a job given twice is shown once."""
    by_name: dict[str, list[str]] = {name: [] for name, _, _, _ in FAMILIES}
    seen = set()
    for status, found in jobs:
        try:
            handle = str(status.handle)
            if handle in seen:
                continue
            samples = _samples(status, found)
        except Exception as exc:  # figures of another shape: this job's, not the exposition's
            _left_out(getattr(status, "handle", "a job"), f"its figures cannot be shown ({type(exc).__name__}: {exc})")
            continue
        seen.add(handle)
        for name, line in samples:
            by_name[name].append(line)
    lines = []
    for name, kind, unit, help_text in FAMILIES:
        lines += [f"# TYPE {name} {kind}", f"# HELP {name} {help_text}"] + ([f"# UNIT {name} {unit}"] if unit else [])
        lines += by_name[name]
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
