"""Every bad input: exit code 2, one message naming the field and the fix, no traceback, nothing staged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
