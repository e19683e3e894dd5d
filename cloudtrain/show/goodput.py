"""The lines `status` prints of a job's progress and goodput (worked out by cloudtrain/home/goodput.py)."""

from __future__ import annotations

from typing import Any

from cloudtrain.node.durations import format_duration


def text(found: dict[str, Any]) -> list[str]:
    """The compact lines `status` prints."""
    p, g = found["progress"], found["goodput"]
    lines = []
    if p["step"] is not None:
        parts = [f"step {p['step']}" + (f"/{p['total']} ({p['percent']:g}%)" if p["total"] else "")]
        if p["steps_per_s"]:
            parts.append(f"{p['steps_per_s']:g} steps/s")
        if p["eta_s"] is not None:
            parts.append(f"ETA {p['eta_s']:.0f}s")
        lines.append("progress: " + ", ".join(parts))
    if g["ratio"] is not None:
        losses = ", ".join(f"{k} {v:.1f}s" for k, v in g["losses_s"].items() if v and v >= 0.05)
        cost = ""
        if g["cost_usd"] is not None:
            cost = f"; cost USD {g['cost_usd']:.4f}" + (
                f" (on-demand for the kept work: USD {g['on_demand_kept_usd']:.4f})"
                if g["on_demand_kept_usd"] is not None else "")
        over = f" over {g['submissions']} submissions" if g.get("submissions", 1) > 1 else ""
        lines.append(f"goodput: {g['ratio']:.2f} of {g['paid_s']:.0f}s paid{over}" + (
            f" (lost: {losses})" if losses else "") + cost)
    steps = g.get("step_time_s") or {}
    if steps.get("ideal") is not None:
        slower = f", {_seconds(steps['deviation'])} slower than ideal" if steps.get("deviation") else ""
        lines.append(f"step time: ideal {_seconds(steps['ideal'])}, recent {_seconds(steps['recent'])}{slower}")
    if g.get("checkpoint_interval_s"):
        lines.append(f"checkpoints: every {format_duration(g['checkpoint_interval_s'])} "
                     f"({g['checkpoint_interval_from']})")
    return lines


def _seconds(value: float) -> str:
    """A step time as people read them: 0.095s, 12ms, 2.4s."""
    return f"{value * 1000:.3g}ms" if value < 1 else f"{value:.3g}s"
