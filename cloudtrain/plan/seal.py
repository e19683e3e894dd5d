"""The seal a printed plan carries: a digest of each of its parts, so that ``submit --plan`` can tell a saved plan
from one edited since it was printed, and name the part that changed (``cloudtrain/plan/saved.py`` checks it)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

SEAL = "seal"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def seal_parts(data: dict[str, Any]) -> dict[str, str]:
    """A digest of each part of a plan document: each field, and each field (or item) of one that holds several
    (spec.args, request.Environment, nodes[1] ...), so a change is named where it is."""
    parts = {}
    for key, value in data.items():
        if key == SEAL:
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        named = [(f"{key}.{k}" if isinstance(value, dict) else f"{key}[{k}]", v) for k, v in items]
        parts.update({name: _digest(v) for name, v in named} if named else {key: _digest(value)})
    return parts
