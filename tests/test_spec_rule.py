"""One rule for the project's spec file (issue 17, items 1 and 8): ./cloudtrain.yaml applies to every command run in
its folder, and SCRIPT, flags and `-- ARGS` override it; `--no-spec` ignores it. Before, `submit train.py` beside a
spec ran a different job (named after the script, no restarts, no checkpoint) and `doctor` never read the spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.show.doctor import diagnose

SPEC = """name: ddp-train
script: train.py
args: ["--epochs", "3"]
max_restarts: 3
spot: true
checkpoint: {uri: file:///tmp/ct-spec-rule/ddp-train}
providers:
  aws: {region: eu-north-1, bucket: spec-bucket}
  gcp: {project: spec-project}
"""


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print(1)\n")
    (root / "cloudtrain.yaml").write_text(SPEC)
    return root


def _plan(cli, proj: Path, *args: str) -> tuple[dict, str]:
    result = cli("plan", "-o", "json", *args, cwd=proj)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_a_script_beside_the_spec_is_the_spec_job_with_overrides(cli, proj: Path) -> None:
    plan, err = _plan(cli, proj, "train.py", "--nodes", "2", "--", "--epochs", "5")
    spec = plan["spec"]
    assert plan["job_id"].startswith("ddp-train-") and plan["spec_file"] == "./cloudtrain.yaml"
    assert (spec["max_restarts"], spec["spot"], spec["nodes"]) == (3, True, 2)
    assert spec["checkpoint"]["uri"] == "file:///tmp/ct-spec-rule/ddp-train", "same checkpoint URI: it resumes"
    assert spec["args"] == ["--epochs", "5"], "-- ARGS replace the spec's args"
    assert "note: using ./cloudtrain.yaml" in err and "--no-spec" in err


def test_no_script_uses_the_spec_quietly_and_no_spec_ignores_it(cli, proj: Path) -> None:
    plan, err = _plan(cli, proj)
    assert plan["job_id"].startswith("ddp-train-") and "note:" not in err
    plan, err = _plan(cli, proj, "train.py", "--no-spec")
    assert plan["job_id"].startswith("train-") and plan["spec_file"] is None
    assert plan["spec"].get("max_restarts", 0) == 0 and "note:" not in err
    refused = cli("plan", "--no-spec", cwd=proj)
    assert refused.returncode == 2 and "SCRIPT: no training script given" in refused.stderr


def test_the_text_plan_names_its_spec_file(cli, proj: Path) -> None:
    result = cli("plan", "train.py", cwd=proj)
    assert result.returncode == 0, result.stderr
    assert "spec         ./cloudtrain.yaml (with the flags given, which override it)" in result.stdout


def test_an_empty_file_flag_is_not_silently_no_spec(cli, proj: Path) -> None:
    result = cli("plan", "train.py", "-f", "", cwd=proj)
    assert result.returncode == 2 and "-f/--file: spec file '' does not exist" in result.stderr
    result = cli("plan", "train.py", "-p", "", cwd=proj)
    assert result.returncode == 2 and "unknown provider ''" in result.stderr


def test_a_script_outside_the_specs_source_dir_says_how_to_proceed(cli, proj: Path) -> None:
    (proj.parent / "other.py").write_text("print(1)\n")
    result = cli("plan", str(proj.parent / "other.py"), cwd=proj)
    assert result.returncode == 2 and "source_dir of ./cloudtrain.yaml" in result.stderr
    assert "--no-spec" in result.stderr


def test_config_and_cloud_plans_read_the_same_spec(cli, proj: Path) -> None:
    shown = cli("config", "-p", "aws", "-o", "json", cwd=proj)
    settings = {s["key"]: s for s in json.loads(shown.stdout)["settings"]}
    assert settings["providers.aws.region"]["value"] == "eu-north-1"
    plan, _ = _plan(cli, proj, "train.py", "-p", "aws")
    assert plan["staging"]["region"] == "eu-north-1" and "spec-bucket" in plan["staging"]["prefix"]


def test_doctor_reads_the_projects_spec(proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(proj)
    checks = {(c.area, c.name): c for c in diagnose(["aws", "gcp"], env={}, home=home)}
    assert checks[("cloudtrain", "spec")].status == "ok"
    assert checks[("aws", "region")].status == "ok" and "eu-north-1" in checks[("aws", "region")].detail
    assert "./cloudtrain.yaml" in checks[("aws", "region")].detail
    assert checks[("aws", "bucket")].status == "ok" and checks[("gcp", "project")].status == "ok"
    (proj / "cloudtrain.yaml").write_text("script: train.py\nnodes: 1\nnodes: 2\n")
    checks = {(c.area, c.name): c for c in diagnose(["aws"], env={}, home=home)}
    broken = checks[("cloudtrain", "spec")]
    assert broken.status == "missing" and "given twice" in broken.detail
    assert checks[("aws", "region")].status == "warn", "a broken spec supplies nothing, and doctor still runs"
