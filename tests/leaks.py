"""The session-end check that a test run leaves nothing behind: no new untracked file in the repository's working
tree, no new entry in the system's temp folder of a name cloudtrain or this suite makes (pytest's basetemp aside).

Only names of those shapes count, so what other programs write to /tmp never does. The suite's own temp folders
carry this session's tag (``SESSION``, inherited by xdist's workers), so another run of the suite on the same machine
is not taken for this one; cloudtrain's untagged ``cloudtrain-*`` count only when they outlive a short grace (another
run's copy in flight passes). Files people write by hand in a shared working tree (.py, .md) are left to them: data a
test writes (checkpoint folders, logs, weights) is what this catches."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SESSION = os.environ.setdefault("CLOUDTRAIN_TEST_SESSION", uuid.uuid4().hex[:8])  # the controller's, in workers too
# what this suite (conftest's profile folder, the Slurm cluster) and cloudtrain (packaging, checkpoint copy) name
TAGGED = (f"ct-config-{SESSION}-*", f"ct-slurm-{SESSION}-*")
UNTAGGED = ("cloudtrain-*",)
# never a test's leftovers: environments, caches, and what a person edits in a shared tree while a run goes on (code
# and configuration in the source folders; a test's data, such as the checkpoint folders that once landed at the
# root, still counts wherever it is)
IGNORED = (".nox/*", "*/__pycache__/*", "__pycache__/*", "*.pyc", ".pytest_cache/*", ".mypy_cache/*",
           ".ruff_cache/*", ".hypothesis/*", "*.egg-info/*", "build/*", "dist/*", "*.py", "*.md")
SOURCE_DIRS = ("cloudtrain/", "entrypoints/", "tests/", "docs/", "benchmarks/", "examples/", "constraints/")
HAND_WRITTEN = (".toml", ".cfg", ".ini", ".txt", ".yaml", ".yml", ".json", ".sh", ".js", ".ts", ".typed")


def untracked() -> set[str]:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if out.returncode != 0:  # not a git checkout (an unpacked sdist's tests): nothing to compare
        return set()
    paths = {line[3:] for line in out.stdout.splitlines() if line.startswith("?? ")}
    return {p for p in paths if not any(fnmatch.fnmatch(p, pattern) for pattern in IGNORED)
            and not (p.startswith(SOURCE_DIRS) and p.endswith(HAND_WRITTEN))}


def temp_entries(patterns: tuple[str, ...] = TAGGED + UNTAGGED) -> set[str]:
    root = Path(tempfile.gettempdir())
    return {p.name for pattern in patterns for p in root.glob(pattern)}


def snapshot() -> tuple[set[str], set[str]]:
    return untracked(), temp_entries()


def left_behind(before: tuple[set[str], set[str]], basetemp: Path | None, grace: float = 2.0) -> list[str]:
    """What this run added since ``before``: paths, one per entry ([] when nothing)."""
    root = Path(tempfile.gettempdir())
    base = basetemp.resolve() if basetemp else None

    def new(patterns: tuple[str, ...]) -> set[str]:
        return {name for name in temp_entries(patterns) - before[1]
                if base is None or not (base == root / name or root / name in base.parents)}

    temp = new(TAGGED)
    passing = new(UNTAGGED)
    if passing:
        time.sleep(grace)
        temp |= passing & new(UNTAGGED)
    tree = untracked() - before[0]
    return [str(REPO / p) for p in sorted(tree)] + [str(root / name) for name in sorted(temp)]
