"""`cloudtrain doctor` for each cloud: credentials, profiles and settings found in a fake environment and real
files under a temporary home, resolved as the providers resolve them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.show import doctor
from cloudtrain.show.doctor import Check, diagnose
from tests.doctor_support import (  # noqa: F401  (fixtures: a temporary home, an empty cwd)
    SECRETS,
    aws,
    aws_files,
    az_profile,
    azure,
    fake_az,
    find,
    gcp,
    home_fixture,
    isolated,
    key_file,
    write,
)


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
    from cloudtrain.providers import get_provider

    aws_files(real_env)
    monkeypatch.setenv("AWS_PROFILE", "dev")
    if case == "env":
        monkeypatch.setenv("AWS_DEFAULT_REGION", "ca-central-1")
    if case == "cloudtrain-profile":
        write(real_env / ".config" / "cloudtrain" / "config.yaml", "default:\n  aws: {region: me-south-1}\n")
    check = find(diagnose(["aws"]), "aws", "region")
    assert check.status == "ok" and check.detail.split()[0] == get_provider("aws").setting("region")


@pytest.mark.parametrize("case", ["gcloud", "env", "cloudtrain-profile"])
def test_gcp_project_and_region_agree_with_the_provider(real_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                        case: str) -> None:
    from cloudtrain.providers import get_provider

    gcloud_config(real_env / ".config" / "gcloud", "default", "[core]\nproject = g-proj\n[ai]\nregion = europe-west4\n")
    if case == "env":
        monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "env-proj")
        monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "us-east4")
    if case == "cloudtrain-profile":
        write(real_env / ".config" / "cloudtrain" / "config.yaml",
              "default:\n  gcp: {project: ct-proj, region: us-west1}\n")
    checks = diagnose(["gcp"])
    gcp = get_provider("gcp")
    assert find(checks, "gcp", "project").detail.split()[0] == gcp.setting("project")
    assert find(checks, "gcp", "region").detail.split()[0] == gcp.setting("region")


@pytest.mark.parametrize("case", ["config-json", "cloudtrain-profile"])
def test_azure_workspace_agrees_with_the_provider(real_env: Path, case: str) -> None:
    from cloudtrain.providers import get_provider

    workspace_of = get_provider("azure").workspace  # type: ignore[attr-defined]
    write(Path.cwd() / ".azureml" / "config.json", json.dumps({"subscription_id": "s", "resource_group": "g",
                                                               "workspace_name": "w"}))
    if case == "cloudtrain-profile":
        write(real_env / ".config" / "cloudtrain" / "config.yaml",
              "default:\n  azure: {resource_group: g2, workspace: w2}\n")
    subscription, group, workspace = workspace_of(SimpleNamespace(subscription_id=None, resource_group=None,
                                                                  workspace=None))
    assert find(diagnose(["azure"]), "azure", "workspace").detail.startswith(
        f"{workspace} (resource group {group}, subscription {subscription}; ")
