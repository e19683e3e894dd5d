"""A test that leaves files behind, for tests/test_suite_guards.py: run on its own (``pytest tests/leaky.py``, never
collected with the suite: its name is not test_*), it must fail the session. LEAK_NAME names what it leaves."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_leaves_a_temp_folder_and_a_file_in_the_tree() -> None:
    name = os.environ["LEAK_NAME"]
    Path(tempfile.gettempdir(), f"cloudtrain-{name}").mkdir()
    (REPO / name / "model.pt").parent.mkdir()
    (REPO / name / "model.pt").write_bytes(b"weights")  # as tests/test_fallback.py's checkpoint folders landed
