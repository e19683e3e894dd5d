"""Colours on a terminal only: never in a pipe, a file or CI logs, and never when NO_COLOR is set."""

from __future__ import annotations

import os
from typing import TextIO

_CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2"}
STATE_COLOURS = {"succeeded": "green", "running": "blue", "pending": "yellow", "stopping": "yellow",
                 "failed": "red", "cancelled": "dim", "preempted": "yellow", "ok": "green", "warn": "yellow",
                 "missing": "red"}


def colour_enabled(stream: TextIO) -> bool:
    """https://no-color.org, FORCE_COLOR for tools that capture a terminal, else only a TTY that isn't 'dumb'."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def paint(text: str, colour: str, enabled: bool) -> str:
    return f"\033[{_CODES[colour]}m{text}\033[0m" if enabled and colour in _CODES else text


def state(text: str, enabled: bool) -> str:
    """A job state (or a check's status) in its colour."""
    return paint(text, STATE_COLOURS.get(text, "bold"), enabled)
