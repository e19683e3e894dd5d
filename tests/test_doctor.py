"""`cloudtrain doctor`: real checks against a fake environment and real files under a temporary home."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain import doctor
from cloudtrain.doctor import Check, diagnose, render
from cloudtrain.errors import ProviderNotFound
from tests.conftest import REPO

# Values that must never reach a check: each is written into a file or the environment by some test.
SECRETS = {
    "aws_key_id": "AKIAQWERTYUIOPASDFGH",
    "aws_file": "aws-file-secret-Zq81",
    "aws_env": "aws-env-secret-Jp22",
    "aws_session": "aws-session-token-Kk93",
    "sso_token": "sso-access-token-Mm44",
    "sso_refresh": "sso-refresh-token-Nn55",
    "azure_env": "azure-client-secret-Pp66",
    "gcp_key": "-----BEGIN PRIVATE KEY-----gcp-private-Rr77",
    "gcp_refresh": "gcp-refresh-token-Ss88",
    "broken_file": "broken-file-secret-Tt99",
}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Not on any cloud's VM (whatever machine runs the tests), in an empty working directory, and with cloudtrain's
    requirements read afresh."""
    monkeypatch.setattr(doctor, "_cloud_vm", lambda: None)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    doctor._requirements.cache_clear()
    yield


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding=encoding)
    return path


def find(checks: list[Check], area: str, name: str) -> Check:
    (found,) = [c for c in checks if (c.area, c.name) == (area, name)]
    return found


def assert_no_secret(checks: list[Check]) -> None:
    shown = render(checks) + render(checks, color=True) + json.dumps([c.to_dict() for c in checks])
    for secret in SECRETS.values():
        assert secret not in shown


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
            "from cloudtrain.doctor import diagnose, render\n"
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
    extras, python = doctor._requirements()
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
    monkeypatch.setattr(doctor, "_source_project", lambda _path: None)
    doctor._requirements.cache_clear()
    extras, python = doctor._requirements()
    doctor._requirements.cache_clear()
    assert ("boto3", "1.35") in extras["aws"]
    assert python.startswith(">=")


def test_real_distribution_lookup() -> None:
    assert doctor._installed_version("PyYAML") == metadata.version("PyYAML")
    assert doctor._installed_version("cloudtrain-no-such-distribution") is None


@pytest.mark.parametrize(("version", "minimum", "expected"), [
    ("2.4.0+cu121", "2.4", True), ("2.3.1", "2.4", False), ("1.35", "1.35.0", True), ("2.10.0", "2.9", True),
    ("1.34.99", "1.35", False)])
def test_version_comparison(version: str, minimum: str, expected: bool) -> None:
    assert doctor._at_least(version, minimum) is expected


def fake_versions(monkeypatch: pytest.MonkeyPatch, **overrides: str | None) -> None:
    """Distribution lookups with some distributions absent (None) or at another version; the rest real."""
    real = doctor._installed_version
    monkeypatch.setattr(doctor, "_installed_version",
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


# -- aws -----------------------------------------------------------------------------------------------------------

def aws_files(home: Path) -> None:
    write(home / ".aws" / "credentials",
          f"[default]\naws_access_key_id = {SECRETS['aws_key_id']}\naws_secret_access_key = {SECRETS['aws_file']}\n\n"
          f"[dev]\naws_access_key_id = {SECRETS['aws_key_id']}\naws_secret_access_key = {SECRETS['aws_file']}\n")
    write(home / ".aws" / "config", "[default]\nregion = us-west-2\n\n[profile dev]\nregion = eu-west-1\n")


def aws(env: dict[str, str], home: Path) -> list[Check]:
    checks = diagnose(["aws"], env=env, home=home)
    assert_no_secret(checks)
    return checks


def test_aws_profile_from_files(home: Path) -> None:
    aws_files(home)
    checks = aws({"AWS_PROFILE": "dev"}, home)
    assert find(checks, "aws", "credentials") == Check("aws", "credentials", "ok",
                                                       "AWS_PROFILE=dev: access keys in ~/.aws/credentials")
    assert find(checks, "aws", "region").detail == "eu-west-1 (AWS profile dev in ~/.aws/config)"
    checks = aws({}, home)
    assert find(checks, "aws", "credentials").detail == "profile default: access keys in ~/.aws/credentials"
    assert find(checks, "aws", "region").detail == "us-west-2 (AWS profile default in ~/.aws/config)"
    # botocore reads AWS_DEFAULT_PROFILE before AWS_PROFILE
    assert find(aws({"AWS_PROFILE": "ghost", "AWS_DEFAULT_PROFILE": "dev"}, home), "aws", "credentials").status == "ok"


def test_aws_files_named_by_the_environment(home: Path, tmp_path: Path) -> None:
    write(tmp_path / "elsewhere" / "creds", f"[ci]\naws_access_key_id = {SECRETS['aws_key_id']}\n"
                                            f"aws_secret_access_key = {SECRETS['aws_file']}\n")
    write(home / "cfg" / "aws.ini", "[profile ci]\nregion = ap-south-1\n")
    env = {"AWS_PROFILE": "ci", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "elsewhere" / "creds"),
           "AWS_CONFIG_FILE": "~/cfg/aws.ini"}
    checks = aws(env, home)
    assert find(checks, "aws", "credentials").detail == f"AWS_PROFILE=ci: access keys in {tmp_path}/elsewhere/creds"
    assert find(checks, "aws", "region").detail == "ap-south-1 (AWS profile ci in ~/cfg/aws.ini)"
    aws_files(home)  # the default files are not read when others are named
    assert find(aws({**env, "AWS_PROFILE": "dev"}, home), "aws", "credentials").status == "missing"


def test_aws_environment_keys(home: Path) -> None:
    env = {"AWS_ACCESS_KEY_ID": SECRETS["aws_key_id"], "AWS_SECRET_ACCESS_KEY": SECRETS["aws_env"],
           "AWS_SESSION_TOKEN": SECRETS["aws_session"], "AWS_REGION": "us-east-2"}
    checks = aws(env, home)
    assert find(checks, "aws", "credentials").detail == \
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY set (with AWS_SESSION_TOKEN)"
    assert find(checks, "aws", "region").detail == "us-east-2 (AWS_REGION)"
    half = find(aws({"AWS_SECRET_ACCESS_KEY": SECRETS["aws_env"]}, home), "aws", "credentials")
    assert half.status == "missing" and "AWS_ACCESS_KEY_ID" in half.fix


def test_aws_profile_named_but_undefined(home: Path) -> None:
    aws_files(home)
    env = {"AWS_PROFILE": "ghost", "AWS_ACCESS_KEY_ID": SECRETS["aws_key_id"],
           "AWS_SECRET_ACCESS_KEY": SECRETS["aws_env"]}
    check = find(aws(env, home), "aws", "credentials")  # boto3 raises ProfileNotFound even with keys set
    assert check.status == "missing" and "AWS_PROFILE=ghost" in check.detail and "ghost" in check.fix


def test_aws_sso(home: Path) -> None:
    write(home / ".aws" / "config", "[profile corp]\nsso_session = acme\nsso_account_id = 123456789012\n"
                                    "sso_role_name = Admin\nregion = us-east-1\n\n"
                                    "[sso-session acme]\nsso_start_url = https://acme.awsapps.com/start\n"
                                    "sso_region = us-east-1\n\n"
                                    "[profile broken]\nsso_session = nowhere\n")
    env = {"AWS_PROFILE": "corp"}
    check = find(aws(env, home), "aws", "credentials")
    assert (check.status, check.fix) == ("warn", "aws sso login --profile corp")
    assert "not logged in" in check.detail
    cache = home / ".aws" / "sso" / "cache" / f"{hashlib.sha1(b'acme').hexdigest()}.json"
    token = {"startUrl": "https://acme.awsapps.com/start", "region": "us-east-1", "accessToken": SECRETS["sso_token"],
             "refreshToken": SECRETS["sso_refresh"], "clientSecret": SECRETS["sso_refresh"]}
    write(cache, json.dumps({**token, "expiresAt": "2999-01-01T00:00:00Z"}))
    check = find(aws(env, home), "aws", "credentials")
    assert check.status == "ok" and "logged in until 2999-01-01 00:00 UTC" in check.detail
    write(cache, json.dumps({**token, "expiresAt": "2001-01-01T00:00:00UTC"}))
    check = find(aws(env, home), "aws", "credentials")
    assert check.status == "warn" and "expired at 2001-01-01 00:00 UTC" in check.detail
    check = find(aws({"AWS_PROFILE": "broken"}, home), "aws", "credentials")
    assert check.status == "missing" and "[sso-session nowhere]" in check.detail


def test_aws_other_sources(home: Path, tmp_path: Path) -> None:
    write(home / ".aws" / "config", "[profile admin]\nrole_arn = arn:aws:iam::123456789012:role/Admin\n"
                                    "source_profile = default\n\n[profile proc]\ncredential_process = /bin/creds\n")
    assert find(aws({"AWS_PROFILE": "admin"}, home), "aws", "credentials").detail == \
        "AWS_PROFILE=admin assumes arn:aws:iam::123456789012:role/Admin from default (~/.aws/config)"
    assert find(aws({"AWS_PROFILE": "proc"}, home), "aws", "credentials").detail == \
        "AWS_PROFILE=proc: credential_process in ~/.aws/config"
    token = write(tmp_path / "token", "eyJ-not-shown")
    env = {"AWS_WEB_IDENTITY_TOKEN_FILE": str(token), "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/Pod"}
    assert find(aws(env, home), "aws", "credentials").status == "ok"
    check = find(aws({**env, "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "absent")}, home), "aws", "credentials")
    assert check.status == "missing" and str(tmp_path / "absent") in check.detail
    check = find(aws({"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/x"}, home), "aws", "credentials")
    assert check == Check("aws", "credentials", "ok",
                          "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI set)")


def test_aws_nothing_found(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = find(aws({}, home), "aws", "credentials")
    assert (check.status, check.fix) == ("missing", "run `aws configure` or `aws sso login`, or export AWS_PROFILE")
    monkeypatch.setattr(doctor, "_cloud_vm", lambda: "aws")
    check = find(aws({}, home), "aws", "credentials")
    assert check.status == "warn" and "instance role" in check.detail
    assert find(aws({"AWS_EC2_METADATA_DISABLED": "true"}, home), "aws", "credentials").status == "missing"
    monkeypatch.setattr(doctor, "_cloud_vm", lambda: "gcp")  # another cloud's VM has no EC2 instance role
    assert find(aws({}, home), "aws", "credentials").status == "missing"


def test_aws_unparsable_file_is_missing_and_quotes_nothing(home: Path) -> None:
    write(home / ".aws" / "credentials", f"aws_secret_access_key = {SECRETS['broken_file']}\n[dev]\n")
    check = find(aws({"AWS_PROFILE": "dev"}, home), "aws", "credentials")
    assert check.status == "missing" and "~/.aws/credentials cannot be parsed" in check.detail


def test_aws_role_bucket_and_region_settings(home: Path) -> None:
    checks = aws({}, home)
    for name, variable in (("role", "CLOUDTRAIN_AWS_ROLE"), ("bucket", "CLOUDTRAIN_AWS_BUCKET")):
        check = find(checks, "aws", name)
        assert check.status == "warn" and variable in check.fix and f"providers.aws.{name}" in check.fix
        assert "submit refuses" in check.detail
    region = find(checks, "aws", "region")
    assert region.status == "warn" and "AWS_REGION" in region.fix
    env = {"CLOUDTRAIN_AWS_ROLE": "arn:aws:iam::123456789012:role/SM", "AWS_DEFAULT_REGION": "eu-west-3"}
    checks = aws(env, home)
    assert find(checks, "aws", "role").detail == "arn:aws:iam::123456789012:role/SM (CLOUDTRAIN_AWS_ROLE)"
    assert find(checks, "aws", "region").detail == "eu-west-3 (AWS_DEFAULT_REGION)"
    write(home / ".config" / "cloudtrain" / "config.yaml", "default:\n  aws: {bucket: my-bucket, region: sa-east-1}\n")
    checks = aws({}, home)
    assert find(checks, "aws", "bucket").detail == "my-bucket (cloudtrain profile default)"
    assert find(checks, "aws", "region").detail == "sa-east-1 (cloudtrain profile default)"


# -- azure ---------------------------------------------------------------------------------------------------------

def azure(env: dict[str, str], home: Path) -> list[Check]:
    checks = diagnose(["azure"], env=env, home=home)
    assert_no_secret(checks)
    return checks


def az_profile(directory: Path, subscriptions: list[dict]) -> None:
    # az writes this file with a byte-order mark
    write(directory / "azureProfile.json", json.dumps({"installationId": "x", "subscriptions": subscriptions}),
          encoding="utf-8-sig")


def fake_az(tmp_path: Path) -> str:
    tool = write(tmp_path / "bin" / "az", "#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return str(tool.parent)


def test_azure_cli_login(home: Path, tmp_path: Path) -> None:
    az_profile(home / ".azure", [{"id": "sub-1", "name": "Research", "isDefault": False, "user": {"name": "a@b"}},
                                 {"id": "sub-2", "name": "Prod", "isDefault": True, "user": {"name": "a@b"}}])
    check = find(azure({"PATH": fake_az(tmp_path)}, home), "azure", "credentials")
    assert check == Check("azure", "credentials", "ok", "Azure CLI login (~/.azure/azureProfile.json, subscription "
                                                        "'Prod')")
    check = find(azure({"PATH": str(tmp_path / "empty")}, home), "azure", "credentials")
    assert check.status == "warn" and "`az` is not on PATH" in check.detail
    az_profile(tmp_path / "azcfg", [{"id": "sub-3", "name": "Other", "isDefault": True}])
    check = find(azure({"PATH": fake_az(tmp_path), "AZURE_CONFIG_DIR": str(tmp_path / "azcfg")}, home), "azure",
                 "credentials")
    assert check.status == "ok" and "'Other'" in check.detail
    az_profile(home / ".azure", [])  # `az logout` leaves the file with no subscription
    check = find(azure({"PATH": fake_az(tmp_path)}, home), "azure", "credentials")
    assert (check.status, check.fix) == ("missing", "az login") and "lists no subscription" in check.detail


def test_azure_environment_credentials(home: Path, tmp_path: Path) -> None:
    ids = {"AZURE_CLIENT_ID": "app-id", "AZURE_TENANT_ID": "tenant-id"}
    check = find(azure({**ids, "AZURE_CLIENT_SECRET": SECRETS["azure_env"]}, home), "azure", "credentials")
    assert check == Check("azure", "credentials", "ok",
                          "service principal: AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET set")
    certificate = write(tmp_path / "sp.pem", "-----BEGIN CERTIFICATE-----")
    assert find(azure({**ids, "AZURE_CLIENT_CERTIFICATE_PATH": str(certificate)}, home), "azure",
                "credentials").status == "ok"
    check = find(azure({**ids, "AZURE_CLIENT_CERTIFICATE_PATH": str(tmp_path / "gone.pem")}, home), "azure",
                 "credentials")
    assert check.status == "missing" and "gone.pem" in check.detail
    token = write(tmp_path / "federated", "jwt")
    check = find(azure({**ids, "AZURE_FEDERATED_TOKEN_FILE": str(token)}, home), "azure", "credentials")
    assert check.status == "ok" and check.detail.startswith("workload identity")
    check = find(azure({"IDENTITY_ENDPOINT": "http://localhost:42356/msi/token"}, home), "azure", "credentials")
    assert check == Check("azure", "credentials", "ok", "managed identity (IDENTITY_ENDPOINT set)")


def test_azure_nothing_found(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = find(azure({"AZURE_CLIENT_ID": "app-id"}, home), "azure", "credentials")
    assert (check.status, check.fix) == ("missing", "az login")
    assert "AZURE_CLIENT_ID set, but a service principal needs" in check.detail
    monkeypatch.setattr(doctor, "_cloud_vm", lambda: "azure")
    check = find(azure({}, home), "azure", "credentials")
    assert check.status == "warn" and "managed identity" in check.detail


def test_azure_workspace(home: Path) -> None:
    check = find(azure({}, home), "azure", "workspace")
    assert check.status == "warn" and "config.json" in check.fix
    write(Path.cwd() / "config.json", json.dumps({"subscription_id": "sub-9", "resource_group": "rg",
                                                  "workspace_name": "ws"}))
    check = find(azure({}, home), "azure", "workspace")
    assert check.status == "ok" and check.detail.startswith("ws (resource group rg, subscription sub-9; from ")
    write(home / ".config" / "cloudtrain" / "config.yaml", "default:\n  azure: {workspace: from-profile}\n")
    assert find(azure({}, home), "azure", "workspace").detail.startswith("from-profile (resource group rg")


# -- gcp -----------------------------------------------------------------------------------------------------------

def gcp(env: dict[str, str], home: Path) -> list[Check]:
    checks = diagnose(["gcp"], env=env, home=home)
    assert_no_secret(checks)
    return checks


def key_file(path: Path) -> Path:
    return write(path, json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "abc",
                                   "private_key": SECRETS["gcp_key"], "client_email": "sa@p.iam.gserviceaccount.com"}))


def test_gcp_key_file(home: Path, tmp_path: Path) -> None:
    key = key_file(tmp_path / "key.json")
    check = find(gcp({"GOOGLE_APPLICATION_CREDENTIALS": str(key)}, home), "gcp", "credentials")
    assert check == Check("gcp", "credentials", "ok", f"GOOGLE_APPLICATION_CREDENTIALS={key} (service_account)")
    write(home / ".config" / "gcloud" / "application_default_credentials.json", "{}")
    check = find(gcp({"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gone.json")}, home), "gcp", "credentials")
    assert check.status == "missing"  # set but absent: google.auth does not fall back to the gcloud file
    assert check.detail == f"GOOGLE_APPLICATION_CREDENTIALS={tmp_path / 'gone.json'}, but that file does not exist"
    not_json = write(tmp_path / "notes.txt", f"private_key {SECRETS['gcp_key']}")
    check = find(gcp({"GOOGLE_APPLICATION_CREDENTIALS": str(not_json)}, home), "gcp", "credentials")
    assert check.status == "missing" and "is not a JSON credentials file" in check.detail


def test_gcp_application_default_login(home: Path, tmp_path: Path) -> None:
    user = {"type": "authorized_user", "client_id": "id", "client_secret": SECRETS["gcp_refresh"],
            "refresh_token": SECRETS["gcp_refresh"]}
    write(home / ".config" / "gcloud" / "application_default_credentials.json", json.dumps(user))
    check = find(gcp({}, home), "gcp", "credentials")
    assert check == Check("gcp", "credentials", "ok", "gcloud application-default login "
                                                      "(~/.config/gcloud/application_default_credentials.json, "
                                                      "authorized_user)")
    write(tmp_path / "gcloud" / "application_default_credentials.json", json.dumps(user))
    check = find(gcp({"CLOUDSDK_CONFIG": str(tmp_path / "gcloud")}, home), "gcp", "credentials")
    assert check.status == "ok" and str(tmp_path / "gcloud") in check.detail


def test_gcp_nothing_found(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = find(gcp({}, home), "gcp", "credentials")
    assert (check.status, check.fix) == ("missing", "gcloud auth application-default login")
    write(home / ".config" / "gcloud" / "credentials.db", "")
    assert "`gcloud auth login` is done" in find(gcp({}, home), "gcp", "credentials").detail
    monkeypatch.setattr(doctor, "_cloud_vm", lambda: "gcp")
    check = find(gcp({}, home), "gcp", "credentials")
    assert check.status == "warn" and "service account" in check.detail


def gcloud_config(root: Path, name: str, text: str) -> None:
    write(root / "active_config", name)
    write(root / "configurations" / f"config_{name}", text)


def test_gcp_project_region_bucket(home: Path) -> None:
    checks = gcp({}, home)
    assert [find(checks, "gcp", n).status for n in ("project", "region", "bucket")] == ["warn"] * 3
    assert "us-central1" in find(checks, "gcp", "region").detail
    gcloud_config(home / ".config" / "gcloud", "work",
                  "[core]\nproject = from-gcloud\n[compute]\nregion = asia-east1\n")
    checks = gcp({"CLOUDTRAIN_GCP_BUCKET": "b"}, home)
    assert find(checks, "gcp", "project").detail == "from-gcloud (gcloud config (core/project))"
    assert find(checks, "gcp", "region").detail == "asia-east1 (gcloud config (compute/region))"
    assert find(checks, "gcp", "bucket").detail == "b (CLOUDTRAIN_GCP_BUCKET)"
    checks = gcp({"GOOGLE_CLOUD_PROJECT": "from-env", "CLOUDSDK_ACTIVE_CONFIG_NAME": "none"}, home)
    assert find(checks, "gcp", "project").detail == "from-env (GOOGLE_CLOUD_PROJECT)"
    assert find(checks, "gcp", "region").status == "warn"  # the named configuration does not exist


# -- doctor resolves settings as the providers do ------------------------------------------------------------------

@pytest.fixture
def real_env(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """os.environ and Path.home() pointing at the temporary home, for the providers' own resolution."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "CLOUDTRAIN_", "CLOUDSDK_", "GOOGLE_", "AZURE_")) or name == "XDG_CONFIG_HOME":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize("case", ["aws-profile", "env", "cloudtrain-profile"])
def test_aws_region_agrees_with_the_provider(real_env: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    pytest.importorskip("botocore")
    from cloudtrain.providers.aws.clients import configured_region

    aws_files(real_env)
    monkeypatch.setenv("AWS_PROFILE", "dev")
    if case == "env":
        monkeypatch.setenv("AWS_DEFAULT_REGION", "ca-central-1")
    if case == "cloudtrain-profile":
        write(real_env / ".config" / "cloudtrain" / "config.yaml", "default:\n  aws: {region: me-south-1}\n")
    check = find(diagnose(["aws"]), "aws", "region")
    assert check.status == "ok" and check.detail.split()[0] == configured_region(None)


@pytest.mark.parametrize("case", ["gcloud", "env", "cloudtrain-profile"])
def test_gcp_project_and_region_agree_with_the_provider(real_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                        case: str) -> None:
    from cloudtrain.providers.gcp.clients import configured_project, configured_region

    gcloud_config(real_env / ".config" / "gcloud", "default", "[core]\nproject = g-proj\n[ai]\nregion = europe-west4\n")
    if case == "env":
        monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "env-proj")
        monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "us-east4")
    if case == "cloudtrain-profile":
        write(real_env / ".config" / "cloudtrain" / "config.yaml",
              "default:\n  gcp: {project: ct-proj, region: us-west1}\n")
    checks = diagnose(["gcp"])
    assert find(checks, "gcp", "project").detail.split()[0] == configured_project(None)
    assert find(checks, "gcp", "region").detail.split()[0] == configured_region(None)


@pytest.mark.parametrize("case", ["config-json", "cloudtrain-profile"])
def test_azure_workspace_agrees_with_the_provider(real_env: Path, case: str) -> None:
    from cloudtrain.providers.azure.workspace import workspace_of

    write(Path.cwd() / ".azureml" / "config.json", json.dumps({"subscription_id": "s", "resource_group": "g",
                                                               "workspace_name": "w"}))
    if case == "cloudtrain-profile":
        write(real_env / ".config" / "cloudtrain" / "config.yaml",
              "default:\n  azure: {resource_group: g2, workspace: w2}\n")
    subscription, group, workspace = workspace_of(SimpleNamespace(subscription_id=None, resource_group=None,
                                                                  workspace=None))
    assert find(diagnose(["azure"]), "azure", "workspace").detail.startswith(
        f"{workspace} (resource group {group}, subscription {subscription}; ")


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
