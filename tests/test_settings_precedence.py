"""One precedence for every setting (issue 32.6): plans (config.lookup), `config` (explain) and doctor resolve through
config.resolve, and say when the project's spec or the environment overrides a profile's value (issue 29.6)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cloudtrain.platforms import doctor_kit
from cloudtrain.show import doctor
from cloudtrain.spec import settings as config
from tests.support import isolated_config, run_main, write_config

ARN = "arn:aws:iam::123456789012:role/{}"


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from isolated_config(tmp_path, monkeypatch)


def _gcloud(tmp_path: Path, project: str, region: str) -> None:
    folder = tmp_path / "gcloud" / "configurations"
    folder.mkdir(parents=True)
    (folder / "config_default").write_text(f"[core]\nproject = {project}\n[ai]\nregion = {region}\n")


def test_lookup_asks_the_platform_hook_as_config_does(cfg: Path, tmp_path: Path) -> None:
    """`lookup` (what plans use) used to skip the declared ``settings`` hook that `config` showed."""
    _gcloud(tmp_path, "from-gcloud", "europe-west4")
    assert config.lookup("gcp", "project") == "from-gcloud"
    assert config.lookup("gcp", "region") == "europe-west4"
    shown = {s.key: (s.value, s.source) for s in config.explain("gcp", {}, {})}
    assert shown["providers.gcp.project"] == ("from-gcloud", "gcloud config (core/project)")


def test_each_place_in_order_with_its_source(cfg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _gcloud(tmp_path, "from-gcloud", "europe-west4")
    found = config.resolve("gcp", "project")
    assert (found.value, found.source, found.kind) == ("from-gcloud", "gcloud config (core/project)", "platform")
    write_config(cfg, {"default": {"gcp": {"project": "from-profile"}}})
    found = config.resolve("gcp", "project")
    assert (found.value, found.source, found.kind) == ("from-profile", f"profile default ({cfg})", "profile")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    assert config.resolve("gcp", "project").source == "env GOOGLE_CLOUD_PROJECT"
    assert config.resolve("gcp", "project", spec="from-spec").kind == "spec"
    found = config.resolve("gcp", "project", flag="from-flag", spec="from-spec", every=True)
    assert found.value == "from-flag"
    assert [(f.kind, f.value) for f in found.shadowed] == [("spec", "from-spec"), ("env", "from-env"),
                                                           ("profile", "from-profile")]
    assert config.resolve("gcp", "bucket").kind == "unset"
    assert config.resolve("aws", "volume_size_gb", default=30).source == "default"


def test_doctor_resolves_as_the_plan_does(cfg: Path, tmp_path: Path) -> None:
    """doctor's setting() goes through the same resolver: spec, then environment, then profile."""
    write_config(cfg, {"default": {"slurm": {"partition": "from-profile"}}})
    user = doctor._user_config({"CLOUDTRAIN_CONFIG": str(cfg)}, tmp_path, ["slurm"])
    ctx = doctor.Context({"SBATCH_PARTITION": "from-env"}, tmp_path, None, user, {"slurm": {}})
    assert doctor_kit.setting(ctx, "slurm", "partition") == ("from-env", "SBATCH_PARTITION")
    ctx = doctor.Context({}, tmp_path, None, user, {"slurm": {}})
    assert doctor_kit.setting(ctx, "slurm", "partition") == ("from-profile", "cloudtrain profile default")
    ctx = doctor.Context({}, tmp_path, None, user, {"slurm": {"partition": "from-spec"}})
    assert doctor_kit.setting(ctx, "slurm", "partition") == ("from-spec", "./cloudtrain.yaml providers.slurm.partition")


def test_the_profile_is_read_once_per_version_of_the_file(cfg: Path) -> None:
    write_config(cfg, {"default": {"aws": {"region": "eu-west-1"}}})
    first = config.read_config()
    assert config.read_config() is first  # not re-read nor re-validated
    config.set_value("aws.region", "eu-west-2")  # a rewrite is seen at once
    assert config.lookup("aws", "region") == "eu-west-2"
    assert config.read_config() is not first
    cfg.write_text(yaml.safe_dump({"default": {"aws": {"region": "eu-west-3"}}}))  # a rewrite in place, same size
    os.utime(cfg, ns=(1, 1))
    assert config.lookup("aws", "region") == "eu-west-3"


def _init_project(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "init")
    assert code == 0, err
    assert yaml.safe_load(Path("cloudtrain.yaml").read_text())["providers"]["aws"]["region"] == "us-east-1"


def test_config_set_says_when_the_projects_spec_wins(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`config set aws.region` in an init-ed project changed nothing and said nothing (issue 29.6)."""
    _init_project(capsys)
    code, out, err = run_main(capsys, "config", "set", "aws.region", "eu-west-1")
    assert code == 0 and "aws.region = eu-west-1 in profile default" in out
    assert err.strip() == (f"note: providers.aws.region: the spec ./cloudtrain.yaml sets 'us-east-1', which wins over "
                           f"'eu-west-1' from profile default ({cfg}); to use the profile's value, remove it from "
                           "./cloudtrain.yaml")
    code, out, _ = run_main(capsys, "config", "-p", "aws")
    assert code == 0
    assert ("note: providers.aws.region: the spec cloudtrain.yaml sets 'us-east-1', which wins over 'eu-west-1' from "
            f"profile default ({cfg})") in out
    # a setting the spec leaves alone: no note
    code, _, err = run_main(capsys, "config", "set", "aws.bucket", "my-bucket")
    assert code == 0 and err == ""


def test_config_set_says_when_the_environment_wins(cfg: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_AWS_ROLE", ARN.format("Env"))
    code, _, err = run_main(capsys, "config", "set", "aws.role", ARN.format("Profile"))
    assert code == 0
    assert f"environment variable CLOUDTRAIN_AWS_ROLE sets '{ARN.format('Env')}'" in err
    assert "to use the profile's value, unset CLOUDTRAIN_AWS_ROLE" in err
    code, out, _ = run_main(capsys, "config", "-p", "aws", "-o", "json")
    role = next(s for s in json.loads(out)["settings"] if s["key"] == "providers.aws.role")
    assert role["overrides"] == [{"value": ARN.format("Profile"), "source": f"profile default ({cfg})"}]
