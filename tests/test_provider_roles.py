"""A declaration's roles are typed (cloudtrain.job_types.ROLES): a plugin whose role object lacks what its role needs
fails when the role loads, with one message naming the provider, the role, where it points and what it lacks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.errors import ProviderNotFound
from cloudtrain.job_types import Declaration

HALF = '''
class HalfProvider:  # no _list: cloudtrain could not list its jobs
    def _submit(self, plan): ...
    def _describe(self, handle): ...
    def _logs(self, handle, follow): ...
    def _cancel(self, handle): ...

doctor = "not a function"

def detect(env): ...
def planned(nodes, rank, job_id, machine_type): return {}
'''


@pytest.fixture
def half(tmp_path: Path) -> Iterator[Declaration]:
    (tmp_path / "halfprov").mkdir()
    (tmp_path / "halfprov" / "__init__.py").write_text("")
    (tmp_path / "halfprov" / "parts.py").write_text(HALF)
    sys.path.insert(0, str(tmp_path))
    try:
        yield Declaration(name="half", summary="a plugin with half its roles", package="halfprov",
                          provider="parts:HalfProvider", doctor="parts:doctor", node="parts",
                          distribution="cloudtrain-half")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "halfprov" or m.startswith("halfprov.")]:
            del sys.modules[name]


@pytest.mark.parametrize(("role", "lacks"), [("provider", "lacks _list"), ("doctor", "lacks __call__"),
                                             ("node", "lacks emulate")])
def test_a_role_that_lacks_what_it_needs_fails_at_load_naming_the_role(half: Declaration, role: str,
                                                                         lacks: str) -> None:
    with pytest.raises(ProviderNotFound) as refused:
        half.load(role)
    message = refused.value.message
    assert message.startswith(f"provider 'half': its {role} role (") and message.endswith(lacks), message
    assert "cloudtrain-half" in (refused.value.remedy or "")


def test_every_builtin_role_loads_as_its_protocol() -> None:
    from cloudtrain import registry
    from cloudtrain.job_types import ROLES

    for name in registry.BUILTIN:
        decl = registry.declaration(name)
        for role in ROLES:
            if role != "node" and getattr(decl, role):
                assert isinstance(decl.load(role), ROLES[role]), (name, role)
        assert registry.node_contract(name).planned  # the node role, checked where the planner loads it
