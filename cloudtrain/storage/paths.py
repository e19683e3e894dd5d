"""Path helpers for code that also runs on a node, where the image's Python may be 3.8 (no Path.is_relative_to)."""

from __future__ import annotations

from pathlib import Path


def is_within(path: Path, root: Path) -> bool:
    """True if ``path`` is ``root`` or below it (compare resolved paths to follow links)."""
    return path == root or root in path.parents
