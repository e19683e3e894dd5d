"""docs/writing-a-provider.md is the provider contract: its tables are checked against the code (every Declaration
field, capability, hook and typed JobStatus field; the built-ins' handle forms and job-name rules; the example's
files), and its examples are the example provider's own code (the declaration, the class head; the conformance test
example runs in tests/test_testing_plugin.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from cloudtrain import registry
from cloudtrain.job_types import TYPED, Capability
from cloudtrain.providers.base import Provider
from tests.plugins import PLUGIN
from tests.support import GUIDE, block, section

BUILTINS = GUIDE.parent / "providers" / "built-ins.md"  # the built-ins' tables, beside the guide


def table(heading: str, index: int = 0, doc: Path = GUIDE) -> list[list[str]]:
    """The rows of a section's ``index``-th table (header and rule left out), cells stripped of backticks."""
    tables = re.findall(r"((?:^\|.*\|\n)+)", section(heading, doc), re.M)
    rows = [line.strip("|").split(" | ") for line in tables[index].strip().splitlines()[2:]]
    return [[cell.strip().strip("`") for cell in row] for row in rows]


@pytest.fixture
def toyprov(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(PLUGIN))
    import toyprov

    yield toyprov
    for name in [m for m in sys.modules if m == "toyprov" or m.startswith("toyprov.")]:
        del sys.modules[name]


def test_every_declaration_field_is_in_the_guide() -> None:
    documented = [row[0] for row in table("The declaration")]
    assert documented == [f.name for f in dataclasses.fields(registry.Declaration)]


def test_the_declaration_shown_is_the_examples(toyprov) -> None:  # type: ignore[no-untyped-def]
    scope = {"__name__": "toyprov"}
    exec(block("The declaration"), scope)
    assert scope["PROVIDER"] == toyprov.PROVIDER
    assert block("The declaration", "toml").split("\n", 1)[1].strip() == 'toy = "toyprov:PROVIDER"'


def test_the_class_shown_is_the_examples(toyprov) -> None:  # type: ignore[no-untyped-def]
    from toyprov.provider import ToyProvider

    scope: dict[str, object] = {}
    exec(block("The provider class"), scope)
    shown = scope["ToyProvider"]
    assert shown.declaration is ToyProvider.declaration and shown.name == "toy"  # type: ignore[attr-defined]
    assert shown.capabilities == ToyProvider.capabilities  # type: ignore[attr-defined]


def test_capabilities_hooks_and_status_fields_are_the_codes() -> None:
    assert [row[0] for row in table("The provider class", 0)] == [c.name for c in Capability]
    for row in table("The provider class", 1):
        assert callable(getattr(Provider, row[0].split("(")[0])), row[0]
    assert [row[0] for row in table("JobStatus: what the core reads")] == list(TYPED)


def test_the_builtins_handles_and_name_rules_are_their_declarations() -> None:
    rows = table("Job names and handles", doc=BUILTINS)
    assert [row[0] for row in rows] == list(registry.BUILTIN)
    for name, handle, rule in rows:
        decl = registry.declaration(name)
        assert (handle, rule) == (decl.handle_form(), decl.name_rule), name
    assert [row[0] for row in table("How the bundle reaches a node", doc=BUILTINS)] == list(registry.BUILTIN)


def test_the_examples_files_and_their_lengths(toyprov) -> None:  # type: ignore[no-untyped-def]
    folder = Path(toyprov.__file__).parent
    rows = table("The example: `toyprov`")
    assert {row[0] for row in rows} == {p.name for p in folder.glob("*.py")}
    for row in rows:
        assert int(row[-1]) == len((folder / row[0]).read_text().splitlines()), row[0]
