"""The suite guards itself: a run that leaves files behind fails, a grouped test xdist did not group stops the run,
every module stays small, no test module imports another, and plan time is measured against a bare interpreter
(benchmarks/cli_startup.py: a ratio, never a timing assert here)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

MAX_LINES = 500


def test_a_run_that_leaves_files_behind_fails_and_names_them(tmp_path: Path) -> None:
    name = f"leak-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDTRAIN_TEST_SESSION", "PYTEST_XDIST_WORKER")}
    temp, tree = Path(tempfile.gettempdir(), f"cloudtrain-{name}"), REPO / name
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              f"--basetemp={tmp_path / 'base'}", "tests/leaky.py"], cwd=REPO,
                             env={**env, "LEAK_NAME": name}, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(tree, ignore_errors=True)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout and "left 2 new file(s) behind" in run.stdout, run.stdout[-3000:]
    assert str(temp) in run.stdout and str(tree / "model.pt") in run.stdout, run.stdout[-3000:]


def test_a_clean_run_passes_and_leaves_no_profile_folder(tmp_path: Path) -> None:
    """Each pytest process made a ct-config-* folder in the temp dir and left it there."""
    session = uuid.uuid4().hex[:8]
    env = {**os.environ, "CLOUDTRAIN_TEST_SESSION": session}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          f"--basetemp={tmp_path / 'base'}", "tests/test_suite_guards.py", "-k", "imports_another"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not list(Path(tempfile.gettempdir()).glob(f"ct-config-{session}-*"))


def test_a_grouped_test_whose_id_lost_its_group_stops_the_run(tmp_path: Path) -> None:
    """Under --dist loadgroup each xdist worker checks, after collection, that every test marked xdist_group has its
    group in its node id (conftest.check_groups): tests/xdist_ungrouped.py takes it out again, as pytest 9.2 does, and
    the run must stop with a usage error before the test runs. Without that plugin the same test runs, grouped."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDTRAIN_TEST_SESSION", "PYTEST_XDIST_WORKER")}

    def run(*plugin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "-n", "1",
                               "--dist", "loadgroup", f"--basetemp={tmp_path / 'base'}", "tests/xdist_ungrouped.py"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    lost = run("-p", "tests.xdist_ungrouped")
    assert lost.returncode == pytest.ExitCode.USAGE_ERROR, lost.stdout[-3000:] + lost.stderr[-3000:]
    assert ("ERROR: pytest-xdist did not group 1 test(s), e.g. tests/xdist_ungrouped.py::test_never_runs: this pytest "
            f"({pytest.__version__}) and pytest-xdist do not work together") in lost.stderr, lost.stderr[-3000:]
    assert "whose id lost its group ran" not in lost.stdout, lost.stdout[-3000:]
    grouped = run()
    assert grouped.returncode == 1 and "FAILED tests/xdist_ungrouped.py::test_never_runs@ungrouped" in grouped.stdout, \
        grouped.stdout[-3000:]


def python_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / p for p in tracked.stdout.split() if (REPO / p).exists()]


def test_every_module_is_small() -> None:
    big = {str(p.relative_to(REPO)): n for p in python_files()
           if (n := len(p.read_text(errors="replace").splitlines())) >= MAX_LINES}
    assert not big, f"modules of {MAX_LINES} lines or more (split them by purpose): {big}"


def test_no_test_module_imports_another() -> None:
    """Helpers and fixtures two test modules share live in support modules (tests/support.py, the fakes,
    conftest.py), not in a test module another imports: a test module stays free to change."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names  # type: ignore[attr-defined]
                      if n.split(".")[:2][-1].startswith("test_") and n.startswith("tests.")]
    assert not found, "\n".join(found)


def test_the_plan_time_benchmark_prints_the_ratio_to_a_bare_interpreter() -> None:
    """The guard itself is benchmarks/cli_startup.py's bound (exit 1 over it); here only that it runs and says it."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cli_startup.py"), "--repeat", "1", "--only",
                             "plan", "--max-plan-ratio", "0"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    labels = [line.split("  ")[0] for line in result.stdout.splitlines()]
    assert labels[:2] == ["python -c pass (baseline)", "cloudtrain plan --provider local"], result.stdout
    ratio = result.stdout.splitlines()[-1]
    assert ratio.startswith("plan ratio ") and float(ratio.split()[2].rstrip("x")) > 0, result.stdout
