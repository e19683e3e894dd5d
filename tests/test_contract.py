"""One table of the plan-to-node contract (cloudtrain/contract.py): every CLOUDTRAIN_* name the code uses is in it
and named through it, the bootstrap's first stage names none, and the docs are generated from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cloudtrain import contract
from tests.conftest import REPO

NAME = re.compile(r"CLOUDTRAIN_[A-Z0-9_]+")
FIRST_STAGE = REPO / "entrypoints" / "bootstrap.py"


def literals(path: Path) -> set[str]:
    """The CLOUDTRAIN_* names written as whole string literals in a file (not prose in docstrings or messages)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            found.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and isinstance(node.values[0].value, str) and NAME.fullmatch(node.values[0].value):
            found.add(node.values[0].value)  # f"CLOUDTRAIN_INPUT_{name}"
    return found


def test_the_docs_are_generated_from_the_table() -> None:
    assert (REPO / "docs" / "node-contract.md").read_text() == contract.markdown(), \
        "docs/node-contract.md is stale: python -m cloudtrain.contract > docs/node-contract.md"


def test_every_name_is_in_the_table_and_named_through_it() -> None:
    """Core and node-side code names a variable through cloudtrain.contract, the providers' node contracts (node.py,
    loaded from the bundle's lib/ beside it) too; a provider's folder may hold its own settings (declared in its
    registry entry) and test seams."""
    stray = {}
    for path in (REPO / "cloudtrain").rglob("*.py"):
        if path.name == "contract.py":
            continue
        provider_folder = path.parent.parent.name == "providers" and path.parent.name != "providers"
        found = literals(path)
        if provider_folder:
            found &= contract.NAMES  # its own names are its own; the contract's are named through the table
        if found:
            stray[str(path.relative_to(REPO))] = sorted(found)
    assert stray == {}


def test_the_bootstraps_first_stage_names_no_variable() -> None:
    """It runs before the bundle (and this table in it) is unpacked, so it must not need one: the node entry, from the
    bundle, names them through the table."""
    assert literals(FIRST_STAGE) == set()


def test_defaults_are_written_once() -> None:
    assert contract.keep_count(None) == contract.keep_count("1") == contract.MIN_KEEP == 2
    assert contract.keep_count("5") == 5 and contract.keep_count("not a number") == 2
    from cloudtrain.spec.model import CheckpointSpec

    assert CheckpointSpec.model_fields["keep"].default == contract.MIN_KEEP
