from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cloudtrain.secrets import MASK, looks_secret, redact
from tests.conftest import SCRIPTS

SECRET = "supersecret-123456"


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                                  "AZURE_STORAGE_CONNECTION_STRING", "github_token", "MY_PRIVATE_KEY"])
def test_secret_names(name: str) -> None:
    assert looks_secret(name, "x")


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "OMP_NUM_THREADS", "KEYBOARD_LAYOUT", "CLOUDTRAIN_STRATEGY"])
def test_ordinary_names(name: str) -> None:
    assert not looks_secret(name, "1")


def test_secret_values_by_shape() -> None:
    assert looks_secret("ANYTHING", "AKIAABCDEFGHIJKLMNOP")
    assert looks_secret("X", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc==")
    assert redact({"env": {"A": "1", "HF_TOKEN": "hf_x"}, "list": [{"SECRET": "s"}]}) == {
        "env": {"A": "1", "HF_TOKEN": MASK}, "list": [{"SECRET": MASK}]}


def test_name_value_entries_are_judged_by_their_name() -> None:
    """Request lists such as AWS tags and Vertex env ({"Key"/"name": n, "Value"/"value": v}) keep n readable."""
    entries = [{"Key": "team", "Value": "vision"}, {"Key": "api_token", "Value": SECRET},
               {"name": "HF_TOKEN", "value": SECRET}, {"name": "EPOCHS", "value": "3"}]
    assert redact(entries) == [{"Key": "team", "Value": "vision"}, {"Key": "api_token", "Value": MASK},
                               {"name": "HF_TOKEN", "value": MASK}, {"name": "EPOCHS", "value": "3"}]


@pytest.mark.slow
def test_secrets_reach_the_job_but_no_output_record_or_log(cli, ct_home: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(SCRIPTS / "uses_secret.py", proj)
    flags = ["--env", f"WANDB_API_KEY={SECRET}", "--env", "PLAIN=visible"]
    for command in (["plan"], ["plan", "-o", "json"], ["plan", "-o", "yaml"], ["submit", "--dry-run", "-o", "json"]):
        out = cli(*command, str(proj / "uses_secret.py"), *flags)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
    assert "visible" in cli("plan", "-o", "json", str(proj / "uses_secret.py"), *flags).stdout

    run = cli("submit", str(proj / "uses_secret.py"), *flags)
    assert run.returncode == 0, run.stderr
    assert "secret received: True" in run.stdout
    for path in ct_home.rglob("*"):  # job database, logs, status files, staged bundle
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
