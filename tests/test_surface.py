"""The public surface, pinned: CLI commands and their flags, the SDK's names, the generated CLI reference and
the shell completion. A change here is a change users see: update the pin on purpose, and say so in the notes."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import cloudtrain
from cloudtrain.cli.completion import script, surface
from cloudtrain.cli.main import build_parser
from cloudtrain.cli.reference import markdown

REPO = Path(__file__).resolve().parents[1]

JOB_FLAGS = ["--allow-secret", "--checkpoint-dir", "--checkpoint-file", "--checkpoint-uri", "--emulate", "--env",
             "--file", "--gpus", "--image", "--max-cost", "--max-idle", "--max-recovery", "--max-restarts",
             "--max-runtime", "--module", "--name", "--no-spec", "--nodes", "--output", "--output-uri",
             "--procs-per-node", "--profile", "--provider", "--require-process-group", "--resume-arg", "--set",
             "--source-dir", "--spot", "--strategy", "--take-over"]
CLI = {
    "submit": sorted([*JOB_FLAGS, "--detach", "--dry-run", "--follow", "--plan", "--restore-from"]),
    "plan": sorted([*JOB_FLAGS, "--compare", "--export", "--region"]),
    "status": ['--output', '--profile'],
    "cancel": ['--output', '--profile'],
    "preempt": ['--output', '--profile'],
    "logs": ['--follow', '--merge', '--profile'],
    "wait": ['--max-recovery', '--max-restarts', '--output', '--profile', '--recover', '--retry-failed',
             '--timeout'],
    "watch": ['--poll', '--profile'],
    "list": ['--limit', '--output', '--profile', '--provider'],
    "outputs": ['--download', '--output', '--profile'],
    "cost": ['--output', '--profile'],
    "checkpoints": ['--output', '--profile'],
    "report": ['--output', '--profile'],
    "catalog": ['--gpus', '--output', '--provider'],
    "config": ['--file', '--output', '--profile', '--provider', '--set'],
    "config show": ['--file', '--output', '--profile', '--provider', '--set'],
    "config set": ['--profile'],
    "config unset": ['--profile'],
    "config path": [],
    "doctor": ['--output', '--provider'],
    "init": ['--dir', '--force', '--output', '--template'],
    "schema": ['--output'],
    "completion": [],
}
SDK = {"CloudtrainError", "Job", "JobSpec", "Run", "__version__", "list_runs"}
JOB_METHODS = {"from_yaml", "plan", "submit"}
RUN_METHODS = {"attach", "cancel", "cost", "logs", "outputs", "preempt", "report", "status", "wait"}


def test_cli_commands_and_flags_are_pinned() -> None:
    found = {name: sorted({f for f in entry["flags"] if f.startswith("--")} - {"--help"})
             for name, entry in surface(build_parser()).items()}
    assert found == CLI


def test_sdk_names_are_pinned() -> None:
    assert set(cloudtrain.__all__) == SDK
    for name in SDK:
        assert getattr(cloudtrain, name) is not None
    public = {n for n, _ in inspect.getmembers(cloudtrain.Job) if not n.startswith("_")}
    assert public == JOB_METHODS
    assert {n for n, _ in inspect.getmembers(cloudtrain.Run) if not n.startswith("_")} == RUN_METHODS
    assert {"progress", "recover", "timeout"} <= set(inspect.signature(cloudtrain.Run.wait).parameters)
    assert {"follow", "merge"} <= set(inspect.signature(cloudtrain.Run.logs).parameters)
    assert "take_over" in inspect.signature(cloudtrain.Job.submit).parameters
    assert "restore_from" in inspect.signature(cloudtrain.Job.submit).parameters


def test_cli_reference_is_generated_from_the_code() -> None:
    doc = (REPO / "docs" / "cli.md").read_text()
    assert doc == markdown(build_parser()), "docs/cli.md is stale: python -m cloudtrain.cli.reference > docs/cli.md"
    for command in (c for c in CLI if " " not in c):
        assert f"## `cloudtrain {command}`" in doc


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_parse(shell: str, tmp_path: Path) -> None:
    text = script(shell, build_parser())
    for command in (c for c in CLI if " " not in c):
        assert command in text
    if shell == "fish":
        assert 'complete -c cloudtrain -n "__fish_seen_subcommand_from plan" -l gpus' in text
        return
    path = tmp_path / "completion.sh"
    path.write_text(text)
    runner = "bash" if shell == "bash" else "zsh"
    if runner == "zsh" and subprocess.run(["which", "zsh"], capture_output=True).returncode != 0:
        runner = "bash"  # zsh is not on every CI image; the function it loads is the bash one, checked there
        path.write_text(text.split("\n", 1)[1])
    check = subprocess.run([runner, "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_bash_completion_completes_commands_flags_and_choices(tmp_path: Path) -> None:
    path = tmp_path / "completion.bash"
    path.write_text(script("bash", build_parser()))

    def complete(*words: str) -> list[str]:
        probe = (f'source {path}; COMP_WORDS=({" ".join(repr(w) for w in ("cloudtrain", *words))}); '
                 f'COMP_CWORD={len(words)}; _cloudtrain; printf "%s\\n" "${{COMPREPLY[@]}}"')
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    assert complete("ca") == ["cancel", "catalog"]
    assert complete("plan", "--gp") == ["--gpus"]
    assert complete("config", "s") == ["show", "set"]
    assert complete("config", "set", "--pro") == ["--profile"]
    assert complete("completion", "") == ["-h", "--help", "bash", "zsh", "fish"]


def test_completion_command_prints_the_script() -> None:
    out = subprocess.run([sys.executable, "-m", "cloudtrain", "completion", "bash"], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0 and "complete -o filenames -F _cloudtrain cloudtrain" in out.stdout
