"""Progress for bundling, uploads, downloads and waits: a redrawn bar on a terminal, an updating bar in a Jupyter
notebook, and a few plain lines anywhere else (CI logs, pipes), so logs stay readable."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    ip = getattr(shell, "get_ipython", lambda: None)() if shell else None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _human(n: float, unit: str) -> str:
    if unit != "B":
        return f"{n:.0f}"
    for suffix in ("B", "KB", "MB", "GB"):
        if n < 1000 or suffix == "GB":
            return f"{n:.0f} {suffix}" if suffix == "B" else f"{n:.1f} {suffix}"
        n /= 1000
    return str(n)


class Progress:
    """``with Progress("uploading", total=n, unit="B") as bar: bar.advance(k)``. ``total=None``: a counter.

    ``mode`` is picked from where output goes: "tty" (one line redrawn), "notebook" (an HTML bar updated in place)
    or "lines" (at most one line per ``every`` seconds, and one at the end). Work that ends within ``quiet``
    seconds shows nothing at all: a progress bar is for waits a person notices."""

    def __init__(self, label: str, total: float | None = None, unit: str = "B", stream: TextIO | None = None,
                 enabled: bool = True, every: float = 10.0, quiet: float = 0.5) -> None:
        self.label, self.total, self.unit, self.every, self.quiet = label, total, unit, every, quiet
        self._shown = False
        self.stream = stream or sys.stderr
        self.done = 0.0
        self.enabled = enabled
        self.mode = "notebook" if _in_notebook() else "tty" if self.stream.isatty() else "lines"
        self._last = 0.0
        self._handle: Any = None
        self._started = time.monotonic()

    def __enter__(self) -> Progress:
        self._show(first=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, amount: float = 1) -> None:
        self.done += amount
        self._show()

    def text(self) -> str:
        if self.total:
            pct = min(100.0, 100.0 * self.done / self.total)
            return f"{self.label}: {pct:3.0f}% {_human(self.done, self.unit)}/{_human(self.total, self.unit)}"
        return f"{self.label}: {_human(self.done, self.unit)}"

    def _show(self, first: bool = False, last: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._started < self.quiet and not (last and self._shown):
            return
        first = first or not self._shown
        self._shown = True
        if self.mode == "lines":
            if first or last or now - self._last >= self.every:
                self._last = now
                suffix = f" ({now - self._started:.1f}s)" if last else ""
                print(self.text() + suffix, file=self.stream, flush=True)
            return
        if not (first or last or now - self._last >= 0.1):  # redraw at most 10 times a second
            return
        self._last = now
        if self.mode == "notebook":
            self._notebook()
        else:
            width = 24
            filled = int(width * self.done / self.total) if self.total else 0
            bar = f"[{'#' * filled}{'.' * (width - filled)}] " if self.total else ""
            self.stream.write(f"\r{bar}{self.text()}\033[K" + ("\n" if last else ""))
            self.stream.flush()

    def _notebook(self) -> None:
        from IPython.display import HTML, display

        html = HTML(progress_html(self.text(), self.done, self.total))
        if self._handle is None:
            self._handle = display(html, display_id=True)
        else:
            self._handle.update(html)

    def close(self) -> None:
        self._show(last=True)
        self.enabled = False


def progress_html(text: str, done: float, total: float | None) -> str:
    import html

    if total:
        return (f"<div><progress value='{done:g}' max='{total:g}' style='width:20em'></progress> "
                f"{html.escape(text)}</div>")
    return f"<div>{html.escape(text)}</div>"
