"""`cloudtrain report HANDLE`: a job's story as one self-contained HTML page (inline SVG and CSS, no request leaves
it, so it opens offline): a lane for the client and per leg and per node with every event marked and named, the step
line and the cost over time, the goodput figures and losses by cause, and a table of the events. ``Run`` in a
notebook shows the same (``fragment``).

A month at the one-minute checkpoint floor is 43,200 checkpoint events (and as many step reports, platform states,
restarts in a crash loop): the page draws and lists at most about MAX_EVENTS of them, so it stays under 2 MB. Each
kind gets its share (step reports at most MAX_STEPS), thinned evenly; what matters is served first and kept whole
where it fits (preemptions, restarts, moves, the job's end), then restores and node starts, then the routine kinds
(step reports, checkpoints, states). The first and the last of every kind are kept, and so is the checkpoint each
restore loaded and the newest before each preemption. The page says how many of each kind were left out. With more
than MAX_LEG_LANES legs they share one lane, and legs narrower than a pixel are drawn as one bar.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any

from cloudtrain.home import goodput

MAX_STEPS = 600  # step points drawn and listed, at most
MAX_EVENTS = 3000  # events drawn and listed, about (~300 bytes each: the page stays under 2 MB)
MAX_LEG_LANES = 12  # more legs share one lane
# the order in which kinds are served from MAX_EVENTS, each tier leaving the rest at least its reserve
TIERS: tuple[tuple[frozenset[str], int], ...] = (
    (frozenset({"preempted", "state preempted", "restarted", "moved", "ended", "submitted", "staged",
                "spot_notice"}), 1500),
    (frozenset(), 900),  # every kind not named in the others: restores, node starts, kinds this page does not know
    (frozenset({"step", "checkpoint", "state"}), 0))
WIDTH, LEFT, RIGHT = 1200, 120, 20
LANE, CHART = 26, 150
COLOURS = {"submitted": "#57606a", "staged": "#57606a", "state": "#8250df", "node_started": "#0969da",
           "step": "#0969da", "checkpoint": "#1a7f37", "spot_notice": "#bf8700", "preempted": "#cf222e",
           "restored": "#8250df", "training_again": "#0969da", "restarted": "#bc4c00", "moved": "#bc4c00",
           "ended": "#24292f"}
SHAPES = {"preempted": "x", "spot_notice": "tri", "checkpoint": "bar", "restored": "dia", "restarted": "dia",
          "moved": "dia"}
CSS = """.ctr{font:13px system-ui,sans-serif;color:#24292f;max-width:1240px}.ctr h2{font-size:18px;margin:4px 0}
.ctr .warn{color:#9a6700;font-weight:600}.ctr table{border-collapse:collapse;margin:6px 0}
.ctr td,.ctr th{padding:1px 8px;text-align:left;border-bottom:1px solid #eaeef2;vertical-align:top}
.ctr svg text{font:11px system-ui,sans-serif;fill:#57606a}.ctr .ev{font-family:ui-monospace,monospace;font-size:12px}
.ctr .fig td:first-child{font-weight:600}.ctr details{margin:8px 0}"""


def for_job(provider: Any, handle: Any) -> tuple[Any, dict[str, Any], Any]:
    """(status, story, rate) of one job, as `status` reads them (unknown handles raise the provider's error)."""
    from cloudtrain.jobs.submitted import with_restart_point
    from cloudtrain.plan.cost import rate_from, recorded
    from cloudtrain.show import metrics

    status = with_restart_point(provider.describe(handle))
    return status, metrics.story(provider, handle, status), rate_from(recorded(str(handle)))


def page(status: Any, found: dict[str, Any], rate: Any = None) -> str:
    """The whole HTML document (the little script marks it rendered: a headless browser's check)."""
    title = html.escape(f"cloudtrain report: {status.handle}")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
            f"<meta name='viewport' content='width=device-width'></head><body>{fragment(status, found, rate)}"
            "<script>document.body.dataset.rendered=document.querySelectorAll('svg [data-e]').length</script>"
            "</body></html>\n")


def fragment(status: Any, found: dict[str, Any], rate: Any = None) -> str:
    """The report as one ``<div>`` with its own style (what Jupyter shows for a ``Run``)."""
    told = found["timeline"]
    events: list[dict[str, Any]] = told["events"]
    shown, thinned = _thin(events)
    ignored = told.get("ignored") or {}
    parts = [f"<style>{CSS}</style><div class='ctr'><h2>{html.escape(str(status.handle))}</h2>",
             f"<div>{_esc(status.state.value)}{': ' + _esc(status.message) if status.message else ''}</div>"]
    parts += [f"<div class='warn'>{_esc(w)}</div>" for w in _missing(status, told, events)]
    parts.append(_figures(found, rate))
    parts.append("<div>" + " ".join(f"<span style='color:{c}'>&#9632; {k}</span>" for k, c in COLOURS.items()
                                    if k != "step") + " (hover a mark for its name)</div>")
    parts.append(_svg(status, events, shown, rate))
    if thinned:
        parts.append(f"<div>{_thinned_text(thinned)}</div>")
    if isinstance(ignored, dict) and ignored.get("count"):
        parts.append(f"<div>{_esc(_ignored_text(ignored))}</div>")
    parts.append(_table(shown, _origin(status, events)))
    parts.append("</div>")
    return "".join(parts)


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _missing(status: Any, told: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """What the page cannot show, said on it."""
    said = []
    if not events:
        said.append("No events are known for this job: it has not started (or its timeline was lost); "
                    "nothing to draw yet.")
    elif status.started_at is None and not any(e["e"] == "node_started" for e in events):
        said.append("This job never started: no node of it ran.")
    if told.get("missing"):
        said.append(f"{told['missing']} event line(s) were cut short or unreadable (a node killed mid-write?): "
                    "they are missing from this report.")
    if told.get("logs"):
        said.append(str(told["logs"]))
    return said


def _group(e: dict[str, Any]) -> str:
    """The kind an event is thinned with (a platform state saying preempted counts as a preemption)."""
    return "state preempted" if e["e"] == "state" and e.get("state") == "preempted" else str(e["e"])


def _tier(group: str) -> int:
    return next((n for n, (kinds, _) in enumerate(TIERS) if group in kinds), 1)


def _shares(counts: dict[str, int], budget: int) -> dict[str, int]:
    """Each group's share of ``budget``: the small ones whole, the rest of it evenly (water-filling); step reports
    at most MAX_STEPS."""
    want = {g: min(n, MAX_STEPS) if g == "step" else n for g, n in counts.items()}
    share, left = {}, max(0, budget)
    for k, g in enumerate(sorted(want, key=want.__getitem__)):
        share[g] = min(want[g], left // (len(want) - k))
        left -= share[g]
    return share


def _evenly(items: list[int], k: int) -> list[int]:
    return [items[int(j * len(items) / k)] for j in range(k)] if k > 0 and items else []


def _pick(indices: list[int], share: int, anchors: set[int]) -> set[int]:
    """``share`` of ``indices`` (in time order), evenly spread: the first, the last and the anchors first."""
    if len(indices) <= share:
        return set(indices)
    must = [indices[0], indices[-1], *sorted(anchors.intersection(indices) - {indices[0], indices[-1]})]
    if len(must) > share:
        must = must[:2] + _evenly(must[2:], max(0, share - 2))
    return set(must) | set(_evenly(indices, share - len(must)))


def _anchors(events: list[dict[str, Any]], kept: set[int]) -> set[int]:
    """The checkpoints a reader looks for, of the kept events: the newest before each preemption, restart or move,
    the one each restore loaded (its step), and the five slowest to save."""
    saves = [i for i, e in enumerate(events) if e["e"] == "checkpoint"]
    if not saves:
        return set()
    out: set[int] = set()
    by_step = {events[i].get("step"): i for i in saves}
    k = 0
    for i in sorted(kept):
        e = events[i]
        while k < len(saves) and saves[k] < i:
            k += 1
        if _group(e) in ("preempted", "state preempted", "restarted", "moved", "spot_notice") and k:
            out.add(saves[k - 1])
        if e["e"] in ("restored", "training_again") and e.get("step") in by_step:
            out.add(by_step[e.get("step")])

    def blocked(i: int) -> float:
        v = events[i].get("blocked_s")
        return float(v) if isinstance(v, (int, float)) else 0.0

    return out | set(sorted(saves, key=blocked)[-5:])


def _thin(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, tuple[int, int]]]:
    """The events drawn and listed (about MAX_EVENTS at most), and per kind thinned: (left out, of how many)."""
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        groups.setdefault(_group(e), []).append(i)
    if len(events) <= MAX_EVENTS and len(groups.get("step", [])) <= MAX_STEPS:
        return events, {}
    kept: set[int] = set()
    for n, (_, reserve) in enumerate(TIERS):
        tier = {g: len(ix) for g, ix in groups.items() if _tier(g) == n}
        shares = _shares(tier, MAX_EVENTS - len(kept) - reserve)
        anchors = _anchors(events, kept) if "checkpoint" in tier else set()
        for g in tier:
            kept |= _pick(groups[g], max(shares[g], 2), anchors)
    thinned: dict[str, tuple[int, int]] = {}
    for g, ix in groups.items():
        kind = "state" if g == "state preempted" else g
        out = sum(1 for i in ix if i not in kept)
        was = thinned.get(kind, (0, 0))
        thinned[kind] = (was[0] + out, was[1] + len(ix))
    return [e for i, e in enumerate(events) if i in kept], {k: v for k, v in thinned.items() if v[0]}


def _thinned_text(thinned: dict[str, tuple[int, int]]) -> str:
    said = ", ".join(f"{out:,} of the {of:,} {_esc(kind)} {'reports' if kind == 'step' else 'events'}"
                     for kind, (out, of) in sorted(thinned.items(), key=lambda kv: -kv[1][1]))
    return (f"To keep this page small, {said} are left out of the drawing and the table (thinned evenly; the first "
            "and the last of each kind are kept, every preemption and restart where the page can hold them, and the "
            "checkpoint each restore loaded and the newest before each preemption).")


def _ignored_text(ignored: dict[str, Any]) -> str:
    kinds = ignored.get("kinds")
    said = "; ".join(f"{k} ({v})" for k, v in kinds.items()) if isinstance(kinds, dict) else ""
    return f"{ignored['count']} event line(s) ignored: they failed the checks every event passes" + (
        f": {said}" if said else "") + "."


def _origin(status: Any, events: list[dict[str, Any]]) -> float:
    times = [e["t"] for e in events] + [t for t in (status.created_at, status.started_at) if t]
    return float(min(times)) if times else time.time()


def _figures(found: dict[str, Any], rate: Any) -> str:
    p, g = found["progress"], found["goodput"]

    def s(v: Any, digits: int = 1) -> str:
        return f"{v:.{digits}f} s" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

    losses = g.get("losses_s") or {}
    timed = g.get("step_time_s") or {}
    timed = timed if isinstance(timed, dict) and any(v is not None for v in timed.values()) else {}

    rows = [("goodput", "-" if g["ratio"] is None else f"{g['ratio']:.2f} (kept {s(g['kept_s'])} of "
                                                       f"{s(g['paid_s'])} paid)"),
            ("progress", "-" if p["step"] is None else f"step {p['step']}" + (
                f" of {p['total']} ({p['percent']:g}%)" if p["total"] else "") + (
                f", {p['steps_per_s']:g} steps/s" if p["steps_per_s"] else "") + (
                f", ETA {p['eta_s']:.0f} s" if p["eta_s"] is not None else "")),
            ("lost, by cause", ", ".join(f"{str(k).replace('_', ' ')} {s(v)}" for k, v in losses.items()) or "-"),
            *([("ideal step time", s(timed.get("ideal"), 3) + (f" (recent {s(timed.get('recent'), 3)})" if
                                                            timed.get("recent") is not None else "")),
               ("step time deviation", s(timed.get("deviation"), 3))] if timed else []),
            ("legs", f"{g['legs']} ({g['preemptions']} preemption(s), {g['steps_redone']} step(s) redone)"),
            ("checkpoints", str(g["checkpoints"])),
            ("cost", "no price known for this job" if g["cost_usd"] is None else f"USD {g['cost_usd']:.4f}" + (
                f" (on-demand for the kept work: USD {g['on_demand_kept_usd']:.4f})"
                if g["on_demand_kept_usd"] is not None else "") + (
                f" at USD {rate.hourly:g}/h ({rate.capacity}, {rate.nodes} node(s))" if rate and rate.hourly else ""))]
    return "<table class='fig'>" + "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in rows) + \
        "</table>"


def _lane_of(e: dict[str, Any]) -> str:
    if "node" in e:
        return f"node {e['node']}"
    if "attempt" in e:
        return f"leg {int(e['attempt']) + 1}" if isinstance(e["attempt"], int) else "job"
    return "job"


def _detail(e: dict[str, Any]) -> str:
    text = " ".join(f"{k}={json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}"
                    for k, v in e.items() if k not in ("e", "t", "node"))
    return text if len(text) <= 160 else text[:157] + "..."


def _name(e: dict[str, Any], origin: float) -> str:
    extra = f" step {e['step']}" if isinstance(e.get("step"), int) else ""
    state = f" {e['state']}" if e["e"] in ("state", "ended") and e.get("state") else ""
    return f"{e['e']}{state}{extra} at +{e['t'] - origin:.1f}s ({_lane_of(e)})"


def _ticks(span: float) -> float:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400,
                 172800, 259200, 604800, 1209600, 2592000):
        if span / step <= 10:
            return float(step)
    return span / 10


def _svg(status: Any, events: list[dict[str, Any]], shown: list[dict[str, Any]], rate: Any) -> str:
    origin = _origin(status, events)
    legs = goodput._legs(events, status) if events else []  # the legs goodput counts
    end = max([e["t"] for e in events] + [stop for _, stop, _ in legs] + [t for t in (status.ended_at,) if t]
              + [origin + 1.0])
    span = end - origin
    named = {_lane_of(e) for e in events}
    # more legs (counted, or named by events) than lanes for them: every leg's marks and bars go in one lane, "legs"
    shared = max(len(legs), sum(1 for n in named if n.startswith("leg "))) > MAX_LEG_LANES

    def lane(e: dict[str, Any]) -> str:
        name = _lane_of(e)
        return "legs" if shared and name.startswith("leg ") else name

    lanes = ["job"] + (["legs"] if shared else [f"leg {n + 1}" for n in range(len(legs))])
    lanes += sorted({"legs" if shared and n.startswith("leg ") else n for n in named} - set(lanes),
                    key=lambda n: (len(n), n))
    plot = WIDTH - LEFT - RIGHT
    top_chart = 24 + LANE * len(lanes) + 16
    height = top_chart + 2 * (CHART + 24) + 10

    def x(t: float) -> float:
        return round(LEFT + (t - origin) / span * plot, 1)

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' viewBox='0 0 {WIDTH} "
           f"{height}' role='img'><title>timeline of {_esc(status.handle)}</title>"]
    tick = _ticks(span)
    k = 0
    while k * tick <= span:  # the time axis: seconds since the first event
        out.append(f"<line x1='{x(origin + k * tick)}' y1='18' x2='{x(origin + k * tick)}' y2='{height - 10}' "
                   f"stroke='#eaeef2'/><text x='{x(origin + k * tick)}' y='12' text-anchor='middle'>"
                   f"{_clock(k * tick)}</text>")
        k += 1
    y_of = {name: 24 + LANE * i + LANE // 2 for i, name in enumerate(lanes)}
    for name, y in y_of.items():
        out.append(f"<text x='4' y='{y + 4}'>{_esc(name)}</text><line x1='{LEFT}' y1='{y}' x2='{WIDTH - RIGHT}' "
                   f"y2='{y}' stroke='#d0d7de'/>")
    for first, last, start, stop, paid in _leg_bars(legs, x, shared):  # each leg's paid time as a bar
        y = y_of["legs" if shared else f"leg {first}"]
        name = f"leg {first}" if first == last else f"legs {first} to {last}"
        out.append(f"<rect x='{x(start)}' y='{y - 7}' width='{max(1.0, x(stop) - x(start))}' "
                   f"height='14' fill='#ddf4ff' stroke='#54aeff'><title>{name}: paid from +{start - origin:.1f}s"
                   f" to +{stop - origin:.1f}s ({paid:.1f} s)</title></rect>")
    for e in shown:
        if e["e"] != "step":
            out.append(_mark(e, x(e["t"]), y_of[lane(e)], _name(e, origin)))
    out.append(_step_chart(shown, top_chart, x, origin))
    out.append(_cost_chart(legs, rate, top_chart + CHART + 24, x))
    out.append("</svg>")
    return "".join(out)


def _leg_bars(legs: list[tuple[float, float, Any]], x: Any, shared: bool) -> list[tuple[int, int, float, float,
                                                                                      float]]:
    """(first leg, last leg, start, stop, seconds paid) of each bar: legs that begin within a pixel of the bar
    before them are drawn as that bar (a crash loop's thousands of legs stay a few hundred bars at most)."""
    bars: list[tuple[int, int, float, float, float]] = []
    for n, (start, stop, _own) in enumerate(legs, start=1):
        if bars and x(start) - x(bars[-1][3]) < 1.0 and shared:
            first, _, begun, ended, paid = bars[-1]
            bars[-1] = (first, n, begun, max(ended, stop), paid + stop - start)
        else:
            bars.append((n, n, start, stop, stop - start))
    return bars


def _clock(seconds: float) -> str:
    if seconds >= 172800:
        return f"{seconds / 86400:g}d"
    return f"{seconds:g}s" if seconds < 120 else f"{seconds / 60:g}m" if seconds < 7200 else f"{seconds / 3600:g}h"


def _mark(e: dict[str, Any], x: float, y: int, name: str) -> str:
    colour = COLOURS.get(e["e"], "#57606a")
    shape = SHAPES.get(e["e"], "dot")
    title = f"<title>{_esc(name)}</title>"
    kind = _esc(e["e"])
    if shape == "bar":
        return f"<rect data-e='{kind}' x='{x - 1.5}' y='{y - 9}' width='3' height='18' fill='{colour}'>{title}</rect>"
    if shape == "x":
        return (f"<path data-e='{kind}' d='M{x - 6} {y - 6}L{x + 6} {y + 6}M{x - 6} {y + 6}L{x + 6} {y - 6}' "
                f"stroke='{colour}' stroke-width='3'>{title}</path>")
    if shape == "tri":
        return f"<path data-e='{kind}' d='M{x} {y - 8}L{x + 7} {y + 5}L{x - 7} {y + 5}Z' fill='{colour}'>{title}</path>"
    if shape == "dia":
        return (f"<path data-e='{kind}' d='M{x} {y - 7}L{x + 6} {y}L{x} {y + 7}L{x - 6} {y}Z' fill='{colour}'>"
                f"{title}</path>")
    return f"<circle data-e='{kind}' cx='{x}' cy='{y}' r='4' fill='{colour}'>{title}</circle>"


def _step_chart(shown: list[dict[str, Any]], top: int, x: Any, origin: float) -> str:
    points = [(e["t"], e["step"]) for e in shown if e["e"] in goodput.STEP_KINDS and isinstance(e.get("step"), int)]
    out = [f"<text x='4' y='{top + 12}'>step</text><rect x='{LEFT}' y='{top}' width='{WIDTH - LEFT - RIGHT}' "
           f"height='{CHART}' fill='none' stroke='#d0d7de'/>"]
    if not points:
        return out[0] + f"<text x='{LEFT + 8}' y='{top + CHART // 2}'>no step reported or checkpointed</text>"
    high = max(s for _, s in points) or 1
    line = " ".join(f"{x(t)},{round(top + CHART - s / high * CHART, 1)}" for t, s in points)
    out.append(f"<text x='4' y='{top + 26}'>max {high}</text><polyline points='{line}' fill='none' "
               f"stroke='#0969da' stroke-width='1.5'><title>steps over time (up to {high})</title></polyline>")
    return "".join(out)


def _cost_chart(legs: list[tuple[float, float, Any]], rate: Any, top: int, x: Any) -> str:
    """Cost accrues during each leg at the job's rate (the paid time goodput counts), flat between legs."""
    out = [f"<text x='4' y='{top + 12}'>cost (USD)</text><rect x='{LEFT}' y='{top}' width='{WIDTH - LEFT - RIGHT}' "
           f"height='{CHART}' fill='none' stroke='#d0d7de'/>"]
    if rate is None or rate.hourly is None or not legs:
        out.append(f"<text x='{LEFT + 8}' y='{top + CHART // 2}'>no price known for this job (its plan had none): "
                   "no cost to draw</text>")
        return "".join(out)
    total, points = 0.0, []
    for start, stop, _ in legs:
        points.append((start, total))
        total += (stop - start) / 3600 * rate.hourly
        points.append((stop, total))
    high = total or 1.0
    line = " ".join(f"{x(t)},{round(top + CHART - c / high * CHART, 1)}" for t, c in _per_pixel(points, x))
    out.append(f"<text x='4' y='{top + 26}'>{total:.4f}</text><polyline points='{line}' fill='none' "
               f"stroke='#bc4c00' stroke-width='1.5'><title>cost over time: USD {total:.4f} at USD {rate.hourly:g}/h"
               "</title></polyline>")
    return "".join(out)


def _per_pixel(points: list[tuple[float, float]], x: Any) -> list[tuple[float, float]]:
    """The first and the last point at each pixel of a rising line (the line drawn looks the same)."""
    out: list[tuple[float, float]] = []
    for t, c in points:
        if len(out) >= 2 and int(x(out[-2][0])) == int(x(out[-1][0])) == int(x(t)):
            out[-1] = (t, c)
        else:
            out.append((t, c))
    return out


def _table(shown: list[dict[str, Any]], origin: float) -> str:
    rows = "".join(f"<tr><td>+{e['t'] - origin:.1f}s</td><td>{_esc(_lane_of(e))}</td><td>{_esc(e['e'])}</td>"
                   f"<td>{_esc(_detail(e))}</td></tr>" for e in shown)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(origin))
    return (f"<details open><summary>{len(shown)} event(s), times since {when}</summary><table class='ev'>"
            f"<tr><th>time</th><th>lane</th><th>event</th><th>details</th></tr>{rows}</table></details>")
