"""Durations as people write them: ``1m``, ``24h``, ``1h30m``, not ``0.0166667h`` or ``86400s``.

The inverse of ``spec.parse_duration`` (every text this returns parses back to the same seconds). Standard library
only: nodes use it too (the watchdog's message).
"""

from __future__ import annotations

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds: float) -> str:
    """``60`` -> ``1m``, ``86400`` -> ``24h``, ``5400`` -> ``1h30m``, ``90`` -> ``1m30s``; days from 48 hours on
    (``2d``, ``28d``), since that is where people stop counting in hours. Fractions of a second are rounded."""
    left = max(0, round(seconds))
    if left == 0:
        return "0s"
    parts = []
    for unit, size in _UNITS:
        if unit == "d" and left < 2 * 86400:
            continue
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
