"""Whole cloudtrain processes timed as an installed cloudtrain runs: with its bytecode.

``pip install`` compiles every module once. A checkout run in place writes ``__pycache__`` on first import, unless
the environment sets ``PYTHONDONTWRITEBYTECODE`` (this project's machine does): then every process compiles each
changed module again, which put 0.1-0.4 s into a CLI call after any edit. Benchmarks that time cloudtrain commands call
:func:`compile_bytecode` first; what a node unpacks from its bundle is compiled there, as on a cloud.
"""

from __future__ import annotations

import compileall
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def compile_bytecode() -> None:
    """Bring cloudtrain's ``__pycache__`` up to date (compileall writes it whatever PYTHONDONTWRITEBYTECODE says)."""
    compileall.compile_dir(str(REPO / "cloudtrain"), quiet=1)
