"""What the `cloudtrain doctor` tests share: secrets that must never be shown, an isolated working folder and
home, and the checks each cloud's tests run (tests/test_doctor.py, tests/test_doctor_clouds.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.show import doctor
from cloudtrain.show.doctor import Check, diagnose, render

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


@pytest.fixture(name="home")
def home_fixture(tmp_path: Path) -> Path:
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


# -- gcp -----------------------------------------------------------------------------------------------------------

def gcp(env: dict[str, str], home: Path) -> list[Check]:
    checks = diagnose(["gcp"], env=env, home=home)
    assert_no_secret(checks)
    return checks


def key_file(path: Path) -> Path:
    return write(path, json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "abc",
                                   "private_key": SECRETS["gcp_key"], "client_email": "sa@p.iam.gserviceaccount.com"}))
