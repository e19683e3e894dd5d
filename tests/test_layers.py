"""The layers hold: the import contracts in pyproject.toml ([tool.importlinter], run by `nox -s lint`) pass on this
tree and fail on a tree with a cycle added; node-side code imports nothing client-side; the bootstrap imports only the
standard library."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import REPO

LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent))


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    assert LINT, "import-linter is part of the dev extra"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--config", str(root / "pyproject.toml")], cwd=root, env=env, capture_output=True,
                          text=True, timeout=240)


def test_the_import_contracts_hold() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:]
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert result.stdout.count("KEPT") == len(contracts) >= 5


@pytest.mark.parametrize(("module", "added", "broken"), [
    ("plan/model.py", "import cloudtrain.sdk", "No import cycles"),  # sdk -> plan -> sdk
    ("providers/gcp/request.py", "import cloudtrain.providers.aws.request", "No provider imports another"),
    ("spec/model.py", "import cloudtrain.cli.render", "Rooms only point down"),
    ("node/steps.py", "import cloudtrain.show.formatting", "Node-side code"),
])
def test_a_cycle_or_an_upward_import_breaks_lint(tmp_path: Path, module: str, added: str, broken: str) -> None:
    shutil.copytree(REPO / "cloudtrain", tmp_path / "cloudtrain", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "cloudtrain" / module
    text = target.read_text()
    target.write_text(text.replace("from __future__ import annotations\n",
                                   f"from __future__ import annotations\n\n{added}  # noqa\n", 1))
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout


def test_the_node_side_contract_forbids_every_client_side_module() -> None:
    """A module or room added at the top of cloudtrain is client-side unless the bundle ships it (packaging.NODE_SIDE):
    the node-side contract must name it as forbidden, so node code cannot start importing it unnoticed."""
    from cloudtrain.bundle.packaging import NODE_SIDE

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    node_side = next(c for c in contracts if c["name"].startswith("Node-side code"))
    package = REPO / "cloudtrain"
    top = {p.stem if p.suffix == ".py" else p.name for p in package.iterdir()
           if (p.suffix == ".py" or (p / "__init__.py").is_file()) and p.name != "__init__.py"}
    shipped = {part.split("/")[0].removesuffix(".py") for part in NODE_SIDE} - {"__init__", "providers"}
    assert {f"cloudtrain.{name}" for name in shipped} == set(node_side["source_modules"])
    assert {f"cloudtrain.{name}" for name in top - shipped} == set(node_side["forbidden_modules"])


def test_the_bootstrap_imports_only_the_standard_library() -> None:
    tree = ast.parse((REPO / "entrypoints" / "bootstrap.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    loaded_from_the_bundle = {"cloudtrain"}  # after unpacking, from the bundle's lib/: never at module level
    top = {node.names[0].name.split(".")[0] if isinstance(node, ast.Import) else (node.module or "").split(".")[0]
           for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert "cloudtrain" not in top
    assert imported - loaded_from_the_bundle <= set(sys.stdlib_module_names)
