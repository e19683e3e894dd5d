"""What the core used to know about each built-in provider now comes from the provider (issue 32.3): spec errors
suggest a plugin's fields and names, the plan summary's provider lines come from ``plan_summary``, doctor asks each
provider's ``cloud_vm`` whether this machine is its VM, and image tables are read per provider."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from cloudtrain import registry
from cloudtrain.errors import SpecError
from cloudtrain.platforms import doctor_kit, images
from cloudtrain.show import doctor
from cloudtrain.spec.model import validate_spec
from tests import plugins
from tests.conftest import REPO

toy_plugin = plugins.toy_plugin  # a fixture

# core modules that once named built-in providers in their logic; they must not again
CORE = ["show/formatting.py", "show/doctor.py", "platforms/images.py", "spec/model.py", "spec/messages.py",
        "spec/settings.py"]


def _literals(path: Path) -> list[tuple[int, str]]:
    """Names and string literals of a module's code (comments and docstrings aside)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.NAME:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and not token.string.startswith(('"""', "'''")):
            try:
                value = ast.literal_eval(token.string)
            except ValueError:  # an f-string: its parts
                value = token.string
            found.append((token.start[0], str(value)))
    return found


@pytest.mark.parametrize("module", CORE)
def test_core_logic_names_no_builtin_provider(module: str) -> None:
    names = {*registry.BUILTIN, *(registry.declaration(n).platform_name for n in registry.BUILTIN)}
    names |= {"StoppingCondition", "BUILTIN"}  # a platform's request field; the registry's own table
    hits = [(line, text) for line, text in _literals(REPO / "cloudtrain" / module) if text in names]
    assert hits == []


def test_did_you_mean_a_plugins_field_and_name(toy_plugin: Path) -> None:
    with pytest.raises(SpecError, match=r"providers\.toy\.queu: unknown key; did you mean 'queue'\?"):
        validate_spec({"script": "t.py", "providers": {"toy": {"queu": "batch"}}})
    with pytest.raises(SpecError, match=r"providers\.tyo: unknown key; did you mean 'toy'\?"):
        validate_spec({"script": "t.py", "providers": {"tyo": {}}})
    with pytest.raises(SpecError, match=r"providers\.asw: unknown key; did you mean 'aws'\?"):
        validate_spec({"script": "t.py", "providers": {"asw": {}}})


def test_a_spec_builds_only_the_options_it_names() -> None:
    spec = validate_spec({"script": "t.py", "providers": {"gcp": {"project": "p"}}})
    assert list(type(spec.providers).model_fields) == ["gcp"]
    assert spec.providers.aws.volume_size_gb == 30  # any other provider reads as its defaults
    with pytest.raises(AttributeError):
        _ = spec.providers.nosuch


def test_cloud_vm_is_each_providers_to_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declared = {n for n in registry.BUILTIN if registry.declaration(n).cloud_vm}
    assert declared == {"aws", "azure", "gcp"}
    firmware = tmp_path / "dmi"
    firmware.mkdir()
    monkeypatch.setattr(doctor_kit, "_DMI", firmware)
    assert doctor._cloud_vm() is None
    for name, text, expected in (("sys_vendor", "Amazon EC2", "aws"), ("sys_vendor", "Google", "gcp"),
                                 ("chassis_asset_tag", "7783-7084-3265-9085-8269-3286-77", "azure")):
        for old in firmware.iterdir():
            old.unlink()
        (firmware / name).write_text(text + "\n")
        assert doctor._cloud_vm() == expected


def test_plan_summary_is_each_providers_to_say() -> None:
    assert all(registry.declaration(n).plan_summary for n in registry.BUILTIN)


def test_image_tables_are_read_per_provider() -> None:
    assert "environments" in images.table("azure") and "containers" in images.table("gcp")
    assert images.table("local") == {}  # declares none
    assert "azure" not in images.data() and "min_python" in images.data()
