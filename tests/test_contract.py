"""One table of the plan-to-node contract (cloudtrain/contract.py): every CLOUDTRAIN_* name the code uses is in it
and named through it, the bootstrap's own copy (it runs before the bundle is unpacked) matches it, and the docs are
generated from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cloudtrain import contract
from cloudtrain.plan.node_commands import bootstrap_module
from tests.conftest import REPO

NAME = re.compile(r"CLOUDTRAIN_[A-Z0-9_]+")
# Files that run where cloudtrain's package is not importable yet, each with its own copy of the names it uses:
# the bootstrap (before the bundle is unpacked) and the node contracts (loaded by the bootstrap by their file).
STANDALONE = {REPO / "entrypoints" / "bootstrap.py", *(REPO / "cloudtrain" / "providers").glob("*/node.py")}


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
    """Core and node-side code names a variable through cloudtrain.contract; a provider's folder may hold its own
    settings (declared in its registry entry) and test seams; the standalone files keep copies of table names."""
    stray = {}
    for path in (REPO / "cloudtrain").rglob("*.py"):
        if path.name == "contract.py" or path in STANDALONE:
            continue
        provider_folder = path.parent.parent.name == "providers" and path.parent.name != "providers"
        found = literals(path)
        if provider_folder:
            found &= contract.NAMES  # its own names are its own; the contract's are named through the table
        if found:
            stray[str(path.relative_to(REPO))] = sorted(found)
    assert stray == {}
    for path in STANDALONE:
        assert literals(path) <= contract.NAMES, path


def test_the_bootstraps_copy_is_the_table() -> None:
    boot = bootstrap_module()
    used = literals(REPO / "entrypoints" / "bootstrap.py")
    copied = {getattr(boot, name) for name in ("NNODES", "NODE_RANK", "PLATFORM", "JOB_ID", "CHECKPOINT_DIR",
                                               "OUTPUT_DIR", "OUTPUT_URI", "MASTER_OVERRIDE",
                                               "RESTORED_STEP")}
    assert used == copied <= contract.NAMES
    for code in ("EXIT_USAGE", "EXIT_PREEMPTED"):
        assert getattr(boot, code) == getattr(contract, code)
    readers = {v.name for v in contract.VARIABLES if "bootstrap" in v.set_by or "bootstrap" in v.read_by}
    assert copied <= readers  # the table says the bootstrap sets or reads each name it copies


def test_defaults_are_written_once() -> None:
    assert contract.keep_count(None) == contract.keep_count("1") == contract.MIN_KEEP == 2
    assert contract.keep_count("5") == 5 and contract.keep_count("not a number") == 2
    from cloudtrain.spec.model import CheckpointSpec

    assert CheckpointSpec.model_fields["keep"].default == contract.MIN_KEEP
