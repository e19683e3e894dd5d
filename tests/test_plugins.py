"""Plugins next to the built-ins: a plugin whose import raises is skipped with one warning naming its distribution,
wherever providers are listed (help, schema, --emulate, config, doctor, catalog), and refused with that name where it
is asked for; plugin lookups are cached until what they depend on changes (sys.path, an installed distribution)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import registry
from cloudtrain.errors import ProviderNotFound
from tests import plugins
from tests.conftest import cli_env, ddp_project
from tests.plugins import install

broken_plugin, toy_plugin = plugins.broken_plugin, plugins.toy_plugin  # fixtures

WARNING = "skipping the plugin 'broken' of distribution 'brokenprov'"


def cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd,
                          env={**cli_env(home), "PYTHONPATH": os.environ["PYTHONPATH"]}, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.parametrize("args", [
    ["plan", "--help"],
    ["plan", "train_ddp.py", "--emulate", "sagemaker", "--nodes", "2"],
    ["schema"],
    ["config", "-o", "json"],
    ["doctor", "--help"],
    ["catalog", "--gpus", "A100"],
])
def test_a_broken_plugin_never_breaks_a_built_in_command(broken_plugin: Path, ct_home: Path, tmp_path: Path,
                                                         args: list[str]) -> None:
    project = ddp_project(tmp_path)
    done = cli(ct_home, *args, cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(WARNING) == 1, done.stderr  # one warning, naming the distribution
    assert "ImportError" in done.stderr and "Traceback" not in done.stderr
    assert not re.search(r"\bbroken\b", done.stdout)  # not listed anywhere


def test_a_broken_plugin_asked_for_by_name_is_refused_naming_its_distribution(broken_plugin: Path,
                                                                               ct_home: Path, tmp_path: Path) -> None:
    project = ddp_project(tmp_path)
    done = cli(ct_home, "plan", "train_ddp.py", "--provider", "broken", cwd=project)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "distribution 'brokenprov'" in done.stderr and "pip install --force-reinstall brokenprov" in done.stderr


def test_the_registry_skips_a_broken_plugin_beside_a_working_one(broken_plugin: Path, toy_plugin: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert registry.names()[-1] == "toy" and "broken" not in registry.declarations()
    assert registry.by_platform("toybatch") is not None and not registry.exists("broken")
    with pytest.raises(ProviderNotFound, match="distribution 'brokenprov'"):
        registry.declaration("broken")
    assert capsys.readouterr().err.count(WARNING) <= 1  # once per process, however often it is listed


def test_an_entry_point_named_unlike_its_declaration_is_refused(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "toyalias", {"toy2": "toyprov:PROVIDER"}, monkeypatch)  # toyprov says name="toy"
    with pytest.raises(ProviderNotFound, match="named 'toy2' but its declaration 'toy'"):
        registry.declaration("toy2")
    assert "toy2" not in registry.names()


def test_plugin_lookups_are_cached_until_an_installed_distribution_changes(toy_plugin: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[tuple[str, ...]] = []
    real = registry._scan
    monkeypatch.setattr(registry, "_scan", lambda path: scans.append(path) or real(path))
    first = registry.declaration("toy")
    for _ in range(20):
        assert registry.declaration("toy") is first and registry.exists("toy")
    registry.names(), registry.declarations()
    assert len(scans) <= 1  # the first lookup may scan; the rest reuse it
    # a distribution installed afterwards (its .dist-info appears in a sys.path folder) is seen at the next lookup
    install(toy_plugin, "toyalias", {"toy3": "toyprov:PROVIDER"}, monkeypatch)
    assert "toy3" in registry._entry_points() and len(scans) == 2
    monkeypatch.setenv("CLOUDTRAIN_PLUGINS", "none")  # the switch is part of the key too
    assert registry.names() == list(registry.BUILTIN)


def test_the_switch_hides_installed_plugins(toy_plugin: Path, ct_home: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert "toy" in registry.names()
    monkeypatch.setenv("CLOUDTRAIN_PLUGINS", "none")
    assert "toy" not in registry.names()
    shown = cli(ct_home, "schema", cwd=tmp_path)
    assert "ToyOptions" not in json.loads(shown.stdout)["$defs"]
