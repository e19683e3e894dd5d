"""User config profiles (``cloudtrain config``): what set/unset write, errors that write nothing, and where each
provider setting comes from, both as ``cloudtrain config`` reports it and as plans actually use it: --set flag >
spec file > environment > profile > the platform's own config > built-in default. Offline: planning only."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain import registry
from cloudtrain.cli.render import settings_text
from cloudtrain.errors import UserError
from cloudtrain.providers.aws.request import PLACEHOLDER_ROLE
from cloudtrain.sdk import Job
from cloudtrain.spec import settings as config
from tests.support import isolated_config, run_main, write_config

CLI = Callable[..., subprocess.CompletedProcess[str]]
ARN = "arn:aws:iam::123456789012:role/{}"


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty config file path, no provider settings in the environment, no AWS/gcloud config of this machine,
    and a project folder as the working directory."""
    yield from isolated_config(tmp_path, monkeypatch)


def shown(capsys: pytest.CaptureFixture[str], provider: str, *args: str) -> dict[str, tuple[Any, str]]:
    """`cloudtrain config -p PROVIDER -o json`: setting -> (value, source)."""
    code, out, err = run_main(capsys, "config", "-p", provider, "-o", "json", *args)
    assert code == 0, err
    data = json.loads(out)
    assert data["config_file"] == str(config.config_path())
    return {s["key"].removeprefix(f"providers.{provider}."): (s["value"], s["source"]) for s in data["settings"]}


def planned(capsys: pytest.CaptureFixture[str], provider: str, *args: str) -> dict[str, Any]:
    """`cloudtrain plan ... -p PROVIDER -o json` (train_ddp.py unless a spec file names the script)."""
    script = [] if Path("cloudtrain.yaml").is_file() else ["train_ddp.py"]
    code, out, err = run_main(capsys, "plan", *script, "-p", provider, "-o", "json", *args)
    assert code == 0, err
    return dict(json.loads(out))


# -- config set / unset / path ------------------------------------------------------------------------------

def test_set_path_unset_through_the_cli(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "home" / "cloudtrain" / "config.yaml"  # its folder does not exist yet
    env = {"CLOUDTRAIN_CONFIG": str(path)}
    done = cli("config", "set", "aws.region", "us-east-1", env_extra=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"aws.region = us-east-1 in profile default ({path})"
    done = cli("config", "set", "providers.aws.role", ARN.format("Research"), "--profile", "research",
               env_extra=env)
    assert done.returncode == 0, done.stderr
    assert "in profile research" in done.stdout
    text = path.read_text()
    assert yaml.safe_load(text) == {"default": {"aws": {"region": "us-east-1"}},
                                    "research": {"aws": {"role": ARN.format("Research")}}}
    assert text.startswith("default:\n  aws:\n    region: us-east-1\nresearch:\n")  # profiles as top-level keys
    located = cli("config", "path", env_extra=env)
    assert (located.returncode, located.stdout.strip()) == (0, str(path))
    removed = cli("config", "unset", "aws.region", env_extra=env)
    assert removed.returncode == 0 and "aws.region removed in profile default" in removed.stdout
    again = cli("config", "unset", "aws.region", env_extra=env)  # says what it did: nothing
    assert again.returncode == 0 and "aws.region was not set in profile default" in again.stdout
    assert yaml.safe_load(path.read_text()) == {"research": {"aws": {"role": ARN.format("Research")}}}
    assert list(path.parent.iterdir()) == [path]  # no temporary file left beside it


def test_config_path_follows_the_environment(tmp_path: Path) -> None:
    assert config.config_path({"CLOUDTRAIN_CONFIG": "~/x/ct.yaml"}) == Path.home() / "x" / "ct.yaml"
    assert config.config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "cloudtrain" / "config.yaml"
    assert config.config_path({}) == Path.home() / ".config" / "cloudtrain" / "config.yaml"


def test_set_reads_values_as_yaml_checked_by_the_spec_model(cfg: Path) -> None:
    config.set_value("aws.volume_size_gb", "100")
    config.set_value("aws.subnets", "[subnet-a, subnet-b]")
    config.set_value("gcp.project", "123456789012")  # a project number: text, though YAML reads a number
    config.set_value("gcp.bucket", "yes")  # a bucket named like a YAML boolean
    config.set_value("gcp.flex_start_max_wait", "2h")
    assert yaml.safe_load(cfg.read_text()) == {"default": {
        "aws": {"volume_size_gb": 100, "subnets": ["subnet-a", "subnet-b"]},
        "gcp": {"project": "123456789012", "bucket": "yes", "flex_start_max_wait": "2h"}}}
    assert config.read_config()["default"]["gcp"]["project"] == "123456789012"  # the file reads back
    assert config.lookup("aws", "volume_size_gb") == 100
    config.set_value("aws.volume_size_gb", None)
    config.set_value("aws.subnets", None)
    assert yaml.safe_load(cfg.read_text()) == {"default": {"gcp": {"project": "123456789012", "bucket": "yes",
                                                                   "flex_start_max_wait": "2h"}}}


def test_unset_of_nothing_writes_nothing(cfg: Path) -> None:
    config.set_value("aws.region", None, profile="nowhere")
    assert not cfg.exists()
    config.set_value("aws.region", "us-east-1")
    before = cfg.read_bytes()
    config.set_value("aws.role", None)
    config.set_value("aws.region", None, profile="nowhere")
    assert cfg.read_bytes() == before
    config.set_value("aws.region", None)  # the last setting of the profile
    assert yaml.safe_load(cfg.read_text()) == {}


@pytest.mark.parametrize(("argv", "expected"), [
    (["aws.regoin", "us-east-1"], "KEY: aws has no setting 'regoin'; did you mean aws.region?"),
    (["gcp.projct", "p"], "did you mean gcp.project?"),
    (["aws.zzz", "1"], "(known: region, role, bucket,"),
    (["cloud.region", "x"], "'cloud.region' is not PROVIDER.SETTING"),
    (["aws", "x"], "'aws' is not PROVIDER.SETTING"),
    (["aws.volume_size_gb", "abc"], "aws.volume_size_gb: Input should be a valid integer"),
    (["aws.volume_size_gb", "0"], "aws.volume_size_gb: must be >= 1"),
    (["aws.instance_type", "p4d.24xlarge"], "aws.instance_type: must match ^ml"),
    (["gcp.capacity", "cheap"], "gcp.capacity: Input should be 'spot' or 'flex_start'"),
])
def test_bad_key_or_value_exits_2_and_writes_nothing(cfg: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], expected: str) -> None:
    write_config(cfg, {"default": {"aws": {"region": "us-east-1"}}})
    before = cfg.read_bytes()
    code, out, err = run_main(capsys, "config", "set", *argv)
    assert code == 2 and out == ""
    assert expected in err and "fix:" in err and "Traceback" not in err
    assert cfg.read_bytes() == before
    assert [p.name for p in cfg.parent.iterdir() if p.name.startswith(".config")] == []


def test_bad_value_message_names_the_key_once(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "config", "set", "aws.volume_size_gb", "abc")
    assert code == 2 and not cfg.exists()
    assert err.splitlines()[0] == ("error: aws.volume_size_gb: Input should be a valid integer, unable to parse "
                                   "string as an integer (got 'abc')")


def test_bad_key_through_the_cli(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    result = cli("config", "set", "aws.regoin", "us-east-1", env_extra={"CLOUDTRAIN_CONFIG": str(path)})
    assert result.returncode == 2 and "did you mean aws.region?" in result.stderr
    assert "Traceback" not in result.stderr and not path.exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("default: [unclosed\n  aws: {", "is not valid YAML at line"),
    ("- aws\n- gcp\n", "must map profile names to provider settings"),
    ("default: just-text\n", "profile 'default' must map providers to settings"),
    ("default:\n  amazon: {region: us-east-1}\n", "profile 'default' names unknown provider 'amazon'"),
    ("default:\n  aws: {regoin: us-east-1}\n", "default.aws.regoin: Extra inputs are not permitted"),
    ("research:\n  aws: {volume_size_gb: lots}\n", "research.aws.volume_size_gb: Input should be a valid integer"),
])
def test_a_malformed_config_file_is_a_clear_error(cfg: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                  expected: str) -> None:
    cfg.write_text(text)
    for argv in (["config", "-p", "aws"], ["plan", "train_ddp.py", "-p", "aws"], ["config", "set", "aws.region", "x"]):
        code, out, err = run_main(capsys, *argv)
        assert code == 2 and out == "", argv
        assert str(cfg) in err and expected in err and "fix:" in err, (argv, err)
    assert cfg.read_text() == text


def test_a_malformed_config_file_through_the_cli(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("default:\n  aws: {region: [us-east-1\n")
    result = cli("config", env_extra={"CLOUDTRAIN_CONFIG": str(path)})
    assert result.returncode == 2 and result.stdout == ""
    assert f"{path} is not valid YAML at line" in result.stderr and "Traceback" not in result.stderr


# -- precedence: what config shows is what plans use ----------------------------------------------------------

def test_aws_precedence_flag_spec_env_profile_platform(cfg: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    profile = f"profile default ({cfg})"

    def check(region: str, region_source: str, role: str | None, role_source: str, *flags: str) -> None:
        settings = shown(capsys, "aws", *flags)
        assert settings["region"] == (region, region_source)
        assert settings["role"] == (role, role_source)
        plan = planned(capsys, "aws", *flags)
        assert plan["staging"]["region"] == region and f".dkr.ecr.{region}.amazonaws.com/" in plan["image"]
        assert plan["request"]["RoleArn"] == (role or PLACEHOLDER_ROLE)
        # the plan's spec records the values cloudtrain filled in (the AWS CLI's config stays botocore's)
        recorded = plan["spec"].get("providers", {}).get("aws", {}).get("region")
        assert recorded == (None if region_source.startswith("aws profile") else region)

    # nothing anywhere: no region, and a plan says so
    assert shown(capsys, "aws")["region"] == (None, "unset")
    code, _, err = run_main(capsys, "plan", "train_ddp.py", "-p", "aws")
    assert code == 2 and "providers.aws.region: no AWS region is set" in err
    # the AWS CLI's own config
    (tmp_path / "aws").mkdir()
    (tmp_path / "aws" / "config").write_text("[default]\nregion = ap-south-1\n")
    check("ap-south-1", "aws profile (~/.aws/config)", None, "unset")
    # the cloudtrain profile beats it
    write_config(cfg, {"default": {"aws": {"region": "eu-north-1", "role": ARN.format("Profile")}},
                       "research": {"aws": {"role": ARN.format("Research")}}})
    check("eu-north-1", profile, ARN.format("Profile"), profile)
    # the environment beats the profile (AWS_REGION before AWS_DEFAULT_REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-1")
    check("us-west-1", "env AWS_DEFAULT_REGION", ARN.format("Profile"), profile)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("CLOUDTRAIN_AWS_ROLE", ARN.format("Env"))
    check("eu-west-3", "env AWS_REGION", ARN.format("Env"), "env CLOUDTRAIN_AWS_ROLE")
    # the spec file beats the environment
    Path("cloudtrain.yaml").write_text(yaml.safe_dump({"script": "train_ddp.py", "providers": {"aws": {
        "region": "us-west-2", "role": ARN.format("Spec")}}}))
    check("us-west-2", "spec", ARN.format("Spec"), "spec")
    # a --set flag beats everything
    check("ca-central-1", "flag", ARN.format("Spec"), "spec", "--set", "providers.aws.region=ca-central-1")
    check("ca-central-1", "flag", ARN.format("Flag"), "flag", "--set", "providers.aws.region=ca-central-1",
          "--set", f"providers.aws.role={ARN.format('Flag')}")


def test_a_bad_value_from_the_environment_or_profile_names_its_source(cfg: Path, capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("CLOUDTRAIN_AWS_BUCKET", "b")  # not an S3 bucket name
    code, out, err = run_main(capsys, "plan", "train_ddp.py", "-p", "aws")
    assert code == 2 and out == "" and "Traceback" not in err
    assert "providers.aws.bucket: from environment variable CLOUDTRAIN_AWS_BUCKET: 'b' is not a valid bucket" in err
    monkeypatch.delenv("CLOUDTRAIN_AWS_BUCKET")
    write_config(cfg, {"default": {"gcp": {"project": "p"}}})
    monkeypatch.setenv("CLOUDTRAIN_GCP_BUCKET", "gs://x")
    code, _, err = run_main(capsys, "plan", "train_ddp.py", "-p", "gcp")
    assert code == 2 and "providers.gcp.bucket: from environment variable CLOUDTRAIN_GCP_BUCKET" in err


def test_profile_selection_flag_env_default(cfg: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(cfg, {"default": {"aws": {"region": "us-east-1", "role": ARN.format("Default"),
                                           "bucket": "default-bucket"}},
                       "research": {"aws": {"role": ARN.format("Research"), "bucket": "research-bucket"}}})
    settings = shown(capsys, "aws")
    assert settings["role"] == (ARN.format("Default"), f"profile default ({cfg})")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # a profile that sets no region takes it from elsewhere

    def uses(profile: str, *flags: str) -> None:
        code, out, _ = run_main(capsys, "config", "-p", "aws", "-o", "json", *flags)
        data = json.loads(out)
        assert code == 0 and data["profile"] == profile
        sources = {s["key"]: s for s in data["settings"]}
        assert sources["providers.aws.role"]["value"] == ARN.format(profile.title())
        assert sources["providers.aws.role"]["source"] == f"profile {profile} ({cfg})"
        assert sources["providers.aws.bucket"]["value"] == f"{profile}-bucket"
        plan = planned(capsys, "aws", *flags)
        assert plan["request"]["RoleArn"] == ARN.format(profile.title())
        assert plan["staging"]["prefix"].startswith(f"s3://{profile}-bucket/cloudtrain/bundles/")
        config.use_profile(None)

    uses("default")
    uses("research", "--profile", "research")
    monkeypatch.setenv("CLOUDTRAIN_PROFILE", "research")
    uses("research")
    uses("default", "--profile", "default")  # the flag beats the variable
    # a profile is not layered over default: research has no region of its own
    assert shown(capsys, "aws")["region"] == ("eu-west-1", "env AWS_REGION")
    monkeypatch.delenv("AWS_REGION")
    assert shown(capsys, "aws")["region"] == (None, "unset")
    assert shown(capsys, "aws", "--profile", "default")["region"] == ("us-east-1", f"profile default ({cfg})")


def test_gcp_project_and_bucket_from_a_profile(cfg: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    profile = f"profile default ({cfg})"
    settings = shown(capsys, "gcp")
    assert settings["project"] == (None, "unset") and settings["region"] == ("us-central1", "default")
    gcloud = tmp_path / "gcloud" / "configurations"
    gcloud.mkdir(parents=True)
    (gcloud.parent / "active_config").write_text("default")
    (gcloud / "config_default").write_text("[core]\nproject = gcloud-project\n[compute]\nregion = asia-east1\n")
    write_config(cfg, {"default": {"gcp": {"project": "profile-project", "bucket": "profile-bucket"}}})
    settings = shown(capsys, "gcp")
    assert settings["project"] == ("profile-project", profile)
    assert settings["bucket"] == ("profile-bucket", profile)
    assert settings["region"] == ("asia-east1", "gcloud config (compute/region)")
    plan = planned(capsys, "gcp")
    assert plan["request"]["parent"] == "projects/profile-project/locations/asia-east1"
    assert plan["staging"]["prefix"].startswith("gs://profile-bucket/cloudtrain/bundles/")
    assert (plan["staging"]["project"], plan["staging"]["region"]) == ("profile-project", "asia-east1")
    assert not any("is not set" in note for note in plan["notes"])
    # below the profile: gcloud's project; above it: the environment
    write_config(cfg, {"default": {"gcp": {"bucket": "profile-bucket", "region": "europe-west4"}}})
    settings = shown(capsys, "gcp")
    assert settings["project"] == ("gcloud-project", "gcloud config (core/project)")
    assert settings["region"] == ("europe-west4", profile)
    assert planned(capsys, "gcp")["request"]["parent"] == "projects/gcloud-project/locations/europe-west4"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-project")
    monkeypatch.setenv("CLOUDTRAIN_GCP_REGION", "us-east4")
    settings = shown(capsys, "gcp")
    assert settings["project"] == ("env-project", "env GOOGLE_CLOUD_PROJECT")
    assert settings["region"] == ("us-east4", "env CLOUDTRAIN_GCP_REGION")
    assert planned(capsys, "gcp")["request"]["parent"] == "projects/env-project/locations/us-east4"


def test_azure_workspace_from_a_profile_is_enough_to_plan(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cloudtrain.providers import get_provider

    workspace_of = get_provider("azure").workspace  # type: ignore[attr-defined]
    workspace = {"subscription_id": "sub-9", "resource_group": "rg-9", "workspace": "ws-9"}
    write_config(cfg, {"default": {"azure": workspace}})
    settings = shown(capsys, "azure")
    assert {k: settings[k] for k in workspace} == {k: (v, f"profile default ({cfg})") for k, v in workspace.items()}
    assert settings["compute"] == (None, "unset")
    plan = planned(capsys, "azure", "--gpus", "A100:8")
    # Azure ML takes the workspace from the MLClient, not the job: the plan carries it in its spec
    assert plan["spec"]["providers"]["azure"] == workspace
    assert plan["request"]["rest"]["properties"]["resources"]["instanceType"] == "Standard_ND96asr_v4"
    with Job(script="train_ddp.py", source_dir=".").plan("azure") as sdk_plan:
        assert workspace_of(sdk_plan.spec.providers.azure) == ("sub-9", "rg-9", "ws-9")
    # the workspace's config.json is below the profile, and fills what the profile leaves out
    Path("config.json").write_text(json.dumps({"subscription_id": "json-sub", "resource_group": "json-rg",
                                               "workspace_name": "json-ws"}))
    write_config(cfg, {"default": {"azure": {"workspace": "ws-9"}}})
    settings = shown(capsys, "azure")
    where = f"azure {Path('config.json').resolve()}"
    assert settings["subscription_id"] == ("json-sub", where) and settings["resource_group"] == ("json-rg", where)
    assert settings["workspace"] == ("ws-9", f"profile default ({cfg})")
    with Job(script="train_ddp.py", source_dir=".").plan("azure") as sdk_plan:
        assert workspace_of(sdk_plan.spec.providers.azure) == ("json-sub", "json-rg", "ws-9")
    # the spec beats the profile
    assert shown(capsys, "azure", "--set", "providers.azure.workspace=flag-ws")["workspace"] == ("flag-ws", "flag")
    # the plan says where the job goes, and a plan without a workspace says what submitting will need
    assert planned(capsys, "azure")["staging"]["workspace"] == "json-sub/json-rg/ws-9"
    code, out, err = run_main(capsys, "plan", "train_ddp.py", "-p", "azure")
    assert code == 0, err
    assert "where        workspace json-sub/json-rg/ws-9" in out
    Path("config.json").unlink()
    plan = planned(capsys, "azure")
    assert "workspace" not in plan["staging"]
    assert any("no Azure ML workspace: subscription_id, resource_group not set" in n for n in plan["notes"]), \
        plan["notes"]


def test_gcloud_without_active_config_reads_its_default_configuration(cfg: Path, capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    """gcloud falls back to the configuration named "default" when active_config is absent; so does cloudtrain."""
    gcloud = tmp_path / "gcloud" / "configurations"
    gcloud.mkdir(parents=True)
    (gcloud / "config_default").write_text("[core]\nproject = fallback-project\n[ai]\nregion = europe-west1\n")
    settings = shown(capsys, "gcp")
    assert settings["project"] == ("fallback-project", "gcloud config (core/project)")
    assert settings["region"] == ("europe-west1", "gcloud config (ai/region)")
    code, out, err = run_main(capsys, "plan", "train_ddp.py", "-p", "gcp")
    assert code == 0, err
    assert "where        project fallback-project, region europe-west1" in out


def test_null_in_the_spec_is_unset(cfg: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``region: null`` in a spec leaves the setting to the environment and profile, in the report and the plan."""
    write_config(cfg, {"default": {"aws": {"region": "eu-north-1", "instance_type": "ml.g5.12xlarge",
                                           "role": ARN.format("Profile")}}})
    Path("cloudtrain.yaml").write_text("script: train_ddp.py\nproviders:\n  aws: {region: null, instance_type: null}\n")
    settings = shown(capsys, "aws")
    assert settings["region"] == ("eu-north-1", f"profile default ({cfg})")
    assert settings["instance_type"] == ("ml.g5.12xlarge", f"profile default ({cfg})")
    plan = planned(capsys, "aws")
    assert plan["staging"]["region"] == "eu-north-1"
    assert plan["request"]["ResourceConfig"]["InstanceType"] == "ml.g5.12xlarge"
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert shown(capsys, "aws")["region"] == ("eu-west-1", "env AWS_REGION")
    assert planned(capsys, "aws")["staging"]["region"] == "eu-west-1"


def test_config_text_table(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_config(cfg, {"default": {"aws": {"region": "us-east-1", "subnets": ["subnet-a", "subnet-b"]}}})
    code, out, _ = run_main(capsys, "config", "-p", "aws")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"config file {cfg}  profile default  spec -"
    assert lines[2].split() == ["SETTING", "VALUE", "SOURCE"]
    rows = {line.split()[0]: line.split(maxsplit=2)[1:] for line in lines[3:]}
    assert rows["providers.aws.region"] == ["us-east-1", f"profile default ({cfg})"]
    assert rows["providers.aws.subnets"] == ["subnet-a,subnet-b", f"profile default ({cfg})"]
    assert rows["providers.aws.volume_size_gb"] == ["30", "default"]
    assert rows["providers.aws.role"] == ["-", "unset"]
    assert len(rows) == 8  # regions too (a fallback list's legs)
    code, out, _ = run_main(capsys, "config")  # every provider
    assert code == 0 and all(f"providers.{p}." in out for p in registry.BUILTIN)
    assert settings_text("aws", [config.Setting("providers.aws.subnets", [], "default")]).splitlines()[1].split() == [
        "providers.aws.subnets", "-", "default"]


# -- the SDK ----------------------------------------------------------------------------------------------------

def test_sdk_use_profile_picks_the_profiles_settings(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(cfg, {"default": {"aws": {"region": "us-east-1", "role": ARN.format("Default")}},
                       "research": {"aws": {"region": "eu-west-1", "role": ARN.format("Research")}}})
    job = Job(script="train_ddp.py", source_dir=".", accelerator="A100:8")
    with job.plan("aws") as plan:
        assert plan.request["RoleArn"] == ARN.format("Default") and plan.staging["region"] == "us-east-1"
    config.use_profile("research")
    assert config.profile_name() == "research"
    with job.plan("aws") as plan:
        assert plan.request["RoleArn"] == ARN.format("Research") and plan.staging["region"] == "eu-west-1"
        assert plan.spec.providers.aws.role == ARN.format("Research")
    monkeypatch.setenv("CLOUDTRAIN_PROFILE", "default")  # the chosen profile beats the variable
    with job.plan("aws") as plan:
        assert plan.request["RoleArn"] == ARN.format("Research")
    config.use_profile(None)
    with job.plan("aws") as plan:
        assert plan.request["RoleArn"] == ARN.format("Default")
    config.use_profile("missing")  # an empty profile: nothing from the file
    with pytest.raises(UserError, match="no AWS region is set"):
        job.plan("aws")
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    with job.plan("aws") as plan:
        assert plan.request["RoleArn"] == PLACEHOLDER_ROLE
        assert any("role is not set" in note and "profile 'missing'" in note for note in plan.notes)
