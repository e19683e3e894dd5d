"""Every bad input: exit code 2, one message naming the field and the fix, no traceback, nothing staged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, cli_env


def _assert_clean_failure(result: subprocess.CompletedProcess[str], home: Path, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error: ")
    for needle in needles:
        assert needle in result.stderr
    assert not (home / "store").exists(), "nothing may be staged"
    assert not (home / "jobs.db").exists(), "nothing may be recorded"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('ok')\n")
    return tmp_path / "proj"


@pytest.mark.parametrize(
    ("spec_text", "needles"),
    [
        ("script: train.py\nnodes: [1,\n", ["not valid YAML at line", "fix:"]),
        ("script: train.py\nnodez: 2\n", ["nodez: unknown key; did you mean 'nodes'?", "fix:"]),
        ("script: train.py\nnodes: 0\n", ["nodes: must be >= 1", "fix: set nodes to a valid value"]),
        ("script: missing.py\n", ["script: script 'missing.py' not found", "fix:"]),
        ("script: train.py\nsource_dir: nowhere\n", ["source_dir: folder", "does not exist"]),
    ],
)
def test_bad_spec_files(cli, ct_home: Path, project: Path, spec_text: str, needles: list[str]) -> None:
    (project / "cloudtrain.yaml").write_text(spec_text)
    for command in (["submit", "-f", "cloudtrain.yaml"], ["plan", "-f", "cloudtrain.yaml"]):
        _assert_clean_failure(cli(*command, cwd=project), ct_home, *needles)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["submit", "train.py", "--nodes", "0"], ["nodes:", ">= 1"]),
        (["submit", "nothere.py"], ["SCRIPT: 'nothere.py' does not exist"]),
        (["submit", "train.py", "--source-dir", "missing"], ["outside the source folder"]),
        (["submit", "train.py", "--provider", "nimbus"], ["--provider: unknown provider 'nimbus'", "local, aws"]),
        (["submit", "train.py", "--provider", "aws", "--set", "providers.aws.region=us-east-1"],
         ["providers.aws.role: is not set", "CLOUDTRAIN_AWS_ROLE"]),
        (["submit", "train.py", "--set", "nodes"], ["--set: 'nodes' is not FIELD=VALUE"]),
        (["submit", "train.py", "--set", "nodez=2"], ["nodez: unknown key; did you mean 'nodes'"]),
        (["submit", "train.py", "--env", "NOEQUALS"], ["--env: a value without NAME= is not KEY=VALUE"]),
        (["submit", "train.py", "--max-runtime", "soon"], ["max_runtime: 'soon' is not a duration"]),
        (["submit"], ["SCRIPT: no training script given", "cloudtrain init"]),
        (["submit", "-f", "nope.yaml"], ["-f/--file: spec file 'nope.yaml' does not exist"]),
        (["status", "not-a-handle"], ["is not a job handle"]),
        (["status", "local://no-such-job"], ["no local job 'no-such-job'"]),
        (["init", "--template", "zero"], ["no template 'zero'", "ddp, fsdp"]),
    ],
)
def test_bad_flags(cli, ct_home: Path, project: Path, args: list[str], needles: list[str]) -> None:
    result = cli(*args, cwd=project)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr
    assert not (ct_home / "store").exists()


def test_argparse_errors_exit_2(cli, project: Path) -> None:
    result = cli("submit", "train.py", "--nodes", "two", cwd=project)
    assert result.returncode == 2 and "invalid int value: 'two'" in result.stderr


def test_missing_extra_names_the_install_command(ct_home: Path, project: Path) -> None:
    # torch hidden from this process only: the local provider's extra is then "not installed".
    code = ("import sys; sys.modules['torch'] = None; from cloudtrain.cli.main import main; "
            "sys.exit(main(['submit', 'train.py', '--provider', 'local']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=project, env=cli_env(ct_home), capture_output=True,
                            text=True, timeout=60)
    _assert_clean_failure(result, ct_home, "provider 'local' needs torch", "pip install 'cloudtrain[local]'")


def test_init_refuses_to_overwrite(cli, project: Path) -> None:
    assert cli("init", cwd=project).returncode == 0
    again = cli("init", cwd=project)
    assert again.returncode == 2 and "--force" in again.stderr
    assert cli("init", "--force", "--template", "fsdp", cwd=project).returncode == 0
    assert "strategy: fsdp" in (project / "cloudtrain.yaml").read_text()
    assert (project / "train.py").read_text() == "print('ok')\n", "an existing script is never overwritten"


def test_repo_root_is_importable() -> None:
    assert (REPO / "cloudtrain" / "__init__.py").is_file()


# -- hostile input (issue 15, items 13 and 14) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["plan", "train.py", "--procs-per-node", "0"], ["procs_per_node: must be between 1 and 256"]),
        (["plan", "train.py", "--procs-per-node", "-1"], ["procs_per_node: must be between 1 and 256"]),
        (["plan", "train.py", "--procs-per-node", "00"], ["procs_per_node: must be between 1 and 256"]),
        (["plan", "train.py", "--procs-per-node", "100000"], ["procs_per_node: must be between 1 and 256"]),
        (["plan", "train.py", "--set", "args=" + "[" * 20_000], ["--set args nests values too deeply"]),
        (["plan", "train.py", "--set", "env={A: 1, A: 2}"], ["key 'A' is given twice"]),
        (["plan", "train.py", "-p", "azure", "--max-runtime", "1d99999999999999999999h"],
         ["max_runtime: '1d99999999999999999999h' is more than a year"]),
        (["plan", "train.py", "-p", "gcp", "--max-runtime", "1d99999999999999999999h", "-o", "json"],
         ["max_runtime:", "more than a year"]),
        (["plan", "train.py", "-p", "azure", "--max-runtime", "22d"],
         ["max_runtime:", "Azure ML's job lifetime of 21"]),
        (["plan", "train.py", "-p", "azure", "--spot", "--max-runtime", "8d"],
         ["max_runtime:", "job lifetime of 7 days on spot"]),
        (["plan", "train.py", "-p", "aws", "--set", "providers.aws.region=us-east-1", "--max-runtime", "29d"],
         ["max_runtime:", "SageMaker's limit of 28 days"]),
        *[(["plan", "train.py", "--checkpoint-uri", uri], ["checkpoint.uri:", "write e.g."])
          for uri in ("s3://", "s3:///x", "file://relative", "file:///", "gs://", "az://")],
        (["list", "--limit", "99999999999999999999999"], ["--limit", "not a whole number from 1 to 10000"]),
        (["wait", "local://x", "--timeout", "nan"], ["--timeout", "not a number of seconds"]),
        (["submit", "--plan", "nothere.json"], ["--plan: cannot read 'nothere.json' as a saved plan"]),
    ],
)
def test_hostile_flags_exit_2_with_the_field(cli, ct_home: Path, project: Path, args: list[str],
                                             needles: list[str]) -> None:
    result = cli(*args, cwd=project)
    assert result.returncode == 2, (result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr[-2000:]
    assert not result.stdout.strip(), "nothing is printed as if it worked (no $4e19 estimate)"
    assert not (ct_home / "store").exists() and not (ct_home / "jobs.db").exists()


@pytest.mark.parametrize(
    ("spec_text", "needles"),
    [
        ("script: train.py\nnodes: 1\nnodes: 2\n", ["key 'nodes' is given twice (first at line 2)"]),
        ("script: train.py\nargs: " + "[" * 20_000 + "\n", ["nests values too deeply"]),
        ("script: ../elsewhere.py\n", ["script: script '../elsewhere.py' is outside source_dir"]),
        ("script: train.py\nrequirements: /etc/hostname\n", ["requirements: requirements file '/etc/hostname'"]),
        ('script: train.py\nenv: {DB: "a\\0b"}\n', ["env.DB: holds a NUL byte"]),
        ('script: train.py\nargs: ["--x", "a\\0b"]\n', ["args[1]: holds a NUL byte"]),
        ("script: train.py\ncheckpoint: {uri: 'file://relative/x'}\n", ["checkpoint.uri: 'file://relative/x'"]),
    ],
)
def test_hostile_spec_files_refused_before_anything_is_staged(cli, ct_home: Path, project: Path, spec_text: str,
                                                              needles: list[str]) -> None:
    (project.parent / "elsewhere.py").write_text("print(1)\n")
    (project / "cloudtrain.yaml").write_text(spec_text)
    for command in (["submit", "--detach"], ["plan"]):
        _assert_clean_failure(cli(*command, cwd=project), ct_home, *needles)


def _without_root_override() -> list[str]:
    """A command prefix under which file permissions apply: root reads any file, so drop that capability."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions cannot be made to apply")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("broken", ["symlink loop", "unreadable file", "unreadable folder"])
def test_a_source_folder_that_cannot_be_read(ct_home: Path, project: Path, tmp_path: Path, broken: str) -> None:
    if broken == "symlink loop":
        (project / "loop1").symlink_to(project / "loop2")
        (project / "loop2").symlink_to(project / "loop1")
        needle = "loop1"
    elif broken == "unreadable file":
        (project / "secret.py").write_text("x = 1\n")
        (project / "secret.py").chmod(0)
        needle = "secret.py: Permission denied"
    else:
        (project / "locked").mkdir()
        (project / "locked" / "a.py").write_text("x = 1\n")
        (project / "locked").chmod(0)
        needle = "locked"
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**cli_env(ct_home), "TMPDIR": str(temp)}
    try:
        result = subprocess.run([*_without_root_override(), sys.executable, "-m", "cloudtrain", "submit",
                                 "train.py", "--detach"], cwd=project, env=env, capture_output=True, text=True,
                                timeout=120)
    finally:
        for path in (project / "secret.py", project / "locked"):
            if path.exists():
                path.chmod(0o755)
    _assert_clean_failure(result, ct_home, "source_dir: ", needle, "fix:")
    assert list(temp.iterdir()) == [], "no half-written bundle is left behind"


def test_a_path_the_user_gave_that_cannot_be_written(cli, ct_home: Path, project: Path) -> None:
    """An OSError about a path (here a folder where init writes its file) is the user's to fix: exit 2, no trace."""
    (project / "cloudtrain.yaml").mkdir()
    result = cli("init", "--force", cwd=project)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cloudtrain.yaml: Is a directory" in result.stderr
    assert "fix: check the path and its permissions" in result.stderr


def test_several_pairs_after_one_set_say_to_repeat_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from cloudtrain.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "train.py", "--no-spec", "--set", "nodes=2", "max_restarts=1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "unrecognized arguments: max_restarts=1" in err
    assert "repeat the flag (--set a=1 --set b=2)" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["plan", "train.py", "--bogus"])
    assert "fix:" not in capsys.readouterr().err  # an unknown flag is only named


@pytest.mark.parametrize(("staging", "said"), [
    ("s3://b/x", "'b' in 's3://b/x' is not a valid name: S3 bucket names"),
    ("gs://B/x", "'B' in 'gs://B/x' is not a valid name: Cloud Storage bucket names"),
    ("az://a_b/x", "'a_b' in 'az://a_b/x' is not a valid name: Azure container names"),
    ("s3://my-bucket/x?v=1", "'s3://my-bucket/x?v=1' has a '?' or '#' part"),
])
def test_a_kubernetes_staging_bucket_no_store_allows(cli, ct_home: Path, project: Path, tmp_path: Path, staging: str,
                                                     said: str) -> None:
    """Issue 38.16: providers.kubernetes.staging s3://b/x passed its own check and ended in a pydantic ValidationError
    traceback when the plan derived output_uri from it. Refused where it is given (flag, spec file, environment,
    profile), naming the field and the fix."""
    flag = cli("plan", "train.py", "-p", "kubernetes", "--set", f"providers.kubernetes.staging={staging}", cwd=project)
    _assert_clean_failure(flag, ct_home, f"providers.kubernetes.staging: {said}",
                          "fix: set providers.kubernetes.staging to a valid value")
    (project / "cloudtrain.yaml").write_text(f"script: train.py\nprovider: kubernetes\nproviders:\n  kubernetes:\n"
                                             f"    staging: '{staging}'\n")
    _assert_clean_failure(cli("plan", "-f", "cloudtrain.yaml", cwd=project), ct_home,
                          f"providers.kubernetes.staging: {said}", "fix:")
    (project / "cloudtrain.yaml").unlink()
    from_env = cli("plan", "train.py", "-p", "kubernetes", cwd=project,
                   env_extra={"CLOUDTRAIN_KUBERNETES_STAGING": staging})
    _assert_clean_failure(from_env, ct_home, "from environment variable CLOUDTRAIN_KUBERNETES_STAGING", said, "fix:")
    config = {"CLOUDTRAIN_CONFIG": str(tmp_path / "config.yaml")}
    refused = cli("config", "set", "kubernetes.staging", staging, cwd=project, env_extra=config)
    assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not (tmp_path / "config.yaml").exists()


def test_a_location_a_provider_derives_that_the_spec_refuses_names_its_setting(cli, ct_home: Path,
                                                                                project: Path) -> None:
    """Slurm's staging written with '..' planned, and the output_uri derived from it ended in a pydantic traceback:
    refused where it is given. And the net under every provider: a location a provider sets on the spec while
    planning that the spec's own checks refuse is a SpecError naming the provider's settings, not a traceback."""
    result = cli("plan", "train.py", "-p", "slurm", "--set", "providers.slurm.staging=/shared/../scratch", cwd=project)
    _assert_clean_failure(result, ct_home, "providers.slurm.staging: '/shared/../scratch' contains '..'", "fix:")
    from cloudtrain.errors import SpecError
    from cloudtrain.plan.assemble import assemble
    from cloudtrain.providers.slurm.provider import SlurmProvider
    from cloudtrain.spec.model import JobSpec

    class Unchecked(SlurmProvider):  # a provider (a plugin's) whose settings let through what it derives from them
        def _translate(self, ctx: Any) -> Any:
            spec = ctx.spec.model_copy(deep=True)
            spec.output_uri = "file:///shared/../scratch/outputs/job"
            raise AssertionError("the spec took it")

    with pytest.raises(SpecError) as refused:  # the planner's net, whatever the provider's translation does
        assemble(Unchecked(), JobSpec(script="train.py", source_dir=str(project)), None)  # type: ignore[arg-type]
    assert refused.value.field == "providers.slurm" and "output_uri as slurm derives it" in refused.value.message
    assert "contains '..'" in refused.value.message and "set output_uri yourself" in (refused.value.remedy or "")
