"""`cloudtrain doctor`: real checks against a fake environment and real files under a temporary home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from cloudtrain.errors import ProviderNotFound
from cloudtrain.platforms import doctor_kit
from cloudtrain.show import doctor
from cloudtrain.show.doctor import Check, diagnose, render
from tests.conftest import REPO
from tests.doctor_support import (  # noqa: F401  (fixtures: a temporary home, an empty cwd)
    SECRETS,
    assert_no_secret,
    aws_files,
    az_profile,
    find,
    home_fixture,
    isolated,
    key_file,
    write,
)

# -- api and rendering -------------------------------------------------------------------------------------------

def test_check_to_dict() -> None:
    check = Check("aws", "region", "warn", "no region", "export AWS_REGION=us-east-1")
    assert check.to_dict() == {"area": "aws", "name": "region", "status": "warn", "detail": "no region",
                               "fix": "export AWS_REGION=us-east-1"}
    assert Check("aws", "extra", "ok", "boto3 1.0").fix == ""


def test_render_aligns_columns_and_puts_fixes_below() -> None:
    checks = [Check("cloudtrain", "python", "ok", "Python 3.11"),
              Check("aws", "credentials", "missing", "none found", "aws configure"),
              Check("gcp", "region", "warn", "no region", "gcloud config set ai/region REGION")]
    lines = render(checks).splitlines()
    assert len(lines) == 5  # one per check, one per fix
    starts = {line.index(detail) for line, detail in zip([lines[0], lines[1], lines[3]],
                                                         ["Python 3.11", "none found", "no region"], strict=True)}
    assert len(starts) == 1  # the detail column is aligned
    assert lines[2] == " " * starts.pop() + "fix: aws configure"
    assert lines[1].startswith("missing  aws ")
    assert "\033[" not in render(checks)
    colored = render(checks, color=True)
    assert "\033[32mok" in colored and "\033[31mmissing" in colored and "\033[33mwarn" in colored
    assert render([]) == ""


def test_providers_limit_the_areas(home: Path) -> None:
    checks = diagnose(["aws"], env={}, home=home)
    assert {c.area for c in checks} == {"cloudtrain", "aws"}
    assert {c.area for c in diagnose(env={}, home=home)} == {"cloudtrain", "local", "aws", "azure", "gcp", "slurm",
                                                                 "kubernetes"}
    assert all(c.status in ("ok", "warn", "missing") and (c.fix == "") == (c.status == "ok")
               for c in diagnose(env={}, home=home))
    with pytest.raises(ProviderNotFound):
        diagnose(["sagemaker"], env={}, home=home)


def test_diagnose_imports_no_sdk_and_is_fast(tmp_path: Path) -> None:
    code = ("import json, sys, time\n"
            "start = time.perf_counter()\n"
            "from cloudtrain.show.doctor import diagnose, render\n"
            "imported = time.perf_counter()\n"
            "render(diagnose())\n"
            "end = time.perf_counter()\n"
            "heavy = ['boto3', 'botocore', 'azure.ai.ml', 'azure.identity', 'google.cloud.aiplatform', 'google.auth',\n"
            "         'torch', 'pydantic']\n"
            "print(json.dumps({'loaded': [m for m in heavy if m in sys.modules], 'import': imported - start,\n"
            "                  'diagnose': end - imported}))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDTRAIN_CONFIG", "XDG_CONFIG_HOME")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["loaded"] == []
    assert result["diagnose"] < 1.0  # typically ~0.04 s; a generous bound for a loaded CI machine


# -- extras and python -------------------------------------------------------------------------------------------

def test_extras_are_read_from_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras, python = doctor_kit._requirements()
    assert python == project["requires-python"]
    for extra in ("local", "aws", "azure", "gcp"):
        wanted = [r.split(">")[0].split("[")[0].strip() for r in project["optional-dependencies"][extra]]
        assert [name for name, _ in extras[extra]] == wanted
    assert ("boto3", "1.35") in extras["aws"] and ("sagemaker-core", "2.20") in extras["aws"]


def test_extras_from_installed_metadata_without_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        metadata.version("cloudtrain")
    except metadata.PackageNotFoundError:
        pytest.skip("cloudtrain is not installed, only on the path")
    monkeypatch.setattr(doctor_kit, "_source_project", lambda _path: None)
    doctor_kit._requirements.cache_clear()
    extras, python = doctor_kit._requirements()
    doctor_kit._requirements.cache_clear()
    assert ("boto3", "1.35") in extras["aws"]
    assert python.startswith(">=")


def test_real_distribution_lookup() -> None:
    assert doctor_kit._installed_version("PyYAML") == metadata.version("PyYAML")
    assert doctor_kit._installed_version("cloudtrain-no-such-distribution") is None


@pytest.mark.parametrize(("version", "minimum", "expected"), [
    ("2.4.0+cu121", "2.4", True), ("2.3.1", "2.4", False), ("1.35", "1.35.0", True), ("2.10.0", "2.9", True),
    ("1.34.99", "1.35", False)])
def test_version_comparison(version: str, minimum: str, expected: bool) -> None:
    assert doctor_kit._at_least(version, minimum) is expected


def fake_versions(monkeypatch: pytest.MonkeyPatch, **overrides: str | None) -> None:
    """Distribution lookups with some distributions absent (None) or at another version; the rest real."""
    real = doctor_kit._installed_version
    monkeypatch.setattr(doctor_kit, "_installed_version",
                        lambda name: overrides[name.replace("-", "_")] if name.replace("-", "_") in overrides
                        else real(name))


def test_missing_extra(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    fake_versions(monkeypatch, boto3=None, sagemaker_core="2.27.0")
    check = find(diagnose(["aws"], env={}, home=home), "aws", "extra")
    assert (check.status, check.fix) == ("missing", "pip install 'cloudtrain[aws]'")
    assert check.detail == "not installed: boto3; installed: sagemaker-core 2.27.0"


def test_old_distribution_is_a_warning(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    fake_versions(monkeypatch, google_cloud_aiplatform="1.59.0", google_cloud_storage="2.18.0")
    check = find(diagnose(["gcp"], env={}, home=home), "gcp", "extra")
    assert check.status == "warn"
    assert "google-cloud-aiplatform 1.59.0 (needs >=1.60)" in check.detail
    assert check.fix == "pip install -U 'cloudtrain[gcp]'"


def test_installed_extras_are_ok(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    fake_versions(monkeypatch, torch="2.5.1+cu124", numpy="2.1.0", azure_ai_ml="1.20.0", azure_identity="1.17.0",
                  azure_storage_blob="12.20.0")
    checks = diagnose(["local", "azure"], env={}, home=home)
    assert find(checks, "local", "torch") == Check("local", "torch", "ok", "torch 2.5.1+cu124, numpy 2.1.0")
    assert find(checks, "azure", "extra").detail == \
        "azure-ai-ml 1.20.0, azure-identity 1.17.0, azure-storage-blob 12.20.0"


def test_missing_torch(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    fake_versions(monkeypatch, torch=None, numpy=None)
    check = find(diagnose(["local"], env={}, home=home), "local", "torch")
    assert check.status == "missing" and check.fix.startswith("pip install 'cloudtrain[local]'")


def test_python_version(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    assert find(diagnose([], env={}, home=home), "cloudtrain", "python").status == "ok"
    monkeypatch.setattr(doctor, "_requirements", lambda: ({}, ">=99.1"))
    check = find(diagnose([], env={}, home=home), "cloudtrain", "python")
    assert (check.status, check.fix) == ("missing", "use Python 99.1 or newer")


# -- cloudtrain's own config ---------------------------------------------------------------------------------------

def test_config_file(home: Path) -> None:
    path = home / ".config" / "cloudtrain" / "config.yaml"
    assert find(diagnose([], env={}, home=home), "cloudtrain", "config").status == "ok"  # none: optional
    write(path, "default:\n  aws: {region: eu-north-1}\nresearch:\n  gcp: {project: p}\n")
    assert find(diagnose([], env={}, home=home), "cloudtrain", "config").detail == \
        "profile default in ~/.config/cloudtrain/config.yaml"
    check = find(diagnose([], env={"CLOUDTRAIN_PROFILE": "ghost"}, home=home), "cloudtrain", "config")
    assert check.status == "warn" and "ghost" in check.detail and "default, research" in check.detail
    write(path, "default: [unclosed\n")
    assert find(diagnose([], env={}, home=home), "cloudtrain", "config").status == "missing"
    write(path, "default:\n  openstack: {region: x}\n")
    assert find(diagnose([], env={}, home=home), "cloudtrain", "config").status == "missing"
    elsewhere = write(home / "elsewhere.yaml", "default:\n  aws: {region: eu-north-1}\n")
    check = find(diagnose([], env={"CLOUDTRAIN_CONFIG": str(elsewhere)}, home=home), "cloudtrain", "config")
    assert check == Check("cloudtrain", "config", "ok", "profile default in ~/elsewhere.yaml")


# -- secrets -------------------------------------------------------------------------------------------------------

def test_no_secret_is_ever_shown(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every secret-bearing file and variable at once, under every combination that reaches a different branch."""
    aws_files(home)
    write(home / ".aws" / "sso" / "cache" / "x.json", json.dumps({"accessToken": SECRETS["sso_token"]}))
    write(home / ".config" / "gcloud" / "application_default_credentials.json",
          json.dumps({"type": "authorized_user", "refresh_token": SECRETS["gcp_refresh"]}))
    az_profile(home / ".azure", [{"id": "s", "name": "Sub", "isDefault": True}])
    write(home / ".azure" / "msal_token_cache.json", json.dumps({"AccessToken": SECRETS["azure_env"]}))
    key = key_file(tmp_path / "key.json")
    envs = [
        {},
        {"AWS_PROFILE": "dev", "AWS_ACCESS_KEY_ID": SECRETS["aws_key_id"]},
        {"AWS_ACCESS_KEY_ID": SECRETS["aws_key_id"], "AWS_SECRET_ACCESS_KEY": SECRETS["aws_env"],
         "AWS_SESSION_TOKEN": SECRETS["aws_session"], "AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t",
         "AZURE_CLIENT_SECRET": SECRETS["azure_env"], "GOOGLE_APPLICATION_CREDENTIALS": str(key)},
        {"AZURE_CLIENT_SECRET": SECRETS["azure_env"], "AWS_SECRET_ACCESS_KEY": SECRETS["aws_env"]},
    ]
    for env in envs:
        checks = diagnose(env=env, home=home)
        assert_no_secret(checks)
        assert SECRETS["aws_key_id"] not in render(checks)
