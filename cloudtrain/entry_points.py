"""Entry points of the installed distributions, read from their ``entry_points.txt`` directly (standard library
only, Python 3.8: the nodes read the ``cloudtrain.stores`` group with it). Importing importlib.metadata alone costs
~35 ms; this scan ~3 ms. Used for provider plugins (cloudtrain.registry) and store plugins (cloudtrain.storage)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple


class Entry(NamedTuple):
    """One entry point, and the distribution that registers it."""

    name: str
    value: str  # "module:attr"
    distribution: str
    where: str  # its .dist-info folder: changes there change a cache key


def scan(path: tuple[str, ...], group: str) -> dict[str, Entry]:
    """The ``group`` entry points of the distributions on ``path``, first distribution of a name first (as
    importlib.metadata orders them)."""
    found: dict[str, Entry] = {}
    seen = set()
    for folder in path:
        try:
            entries = sorted(os.scandir(folder or "."), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            distribution = entry.name.rsplit(".", 1)[0].split("-")[0]
            dist = re.sub(r"[-_.]+", "_", distribution).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                text = Path(entry.path, "entry_points.txt").read_text(encoding="utf-8")
            except OSError:
                continue
            for name, value in lines_of(text, group):
                found.setdefault(name, Entry(name, value, distribution, entry.path))
    return found


def lines_of(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of one [group] of an entry_points.txt."""
    lines, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            inside = line == f"[{group}]"
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            lines.append((name.strip(), value.strip()))
    return lines
