"""Issue 28, items 4, 8 and 10: what a bundle holds and what packaging never touches.

- Exports never ship: a folder written by `plan --export` inside the project (its request holds the job's secrets)
  is left out of the next bundle, and so is any other place cloudtrain writes inside the project (its home, a
  `file://` checkpoint or output store, a plan saved as YAML).
- The script is in the package: a `.gitignore` rule that matches the entry script, the module or the requirements
  file is refused at plan time, naming the file, the line and the rule.
- Special files never hang a command: a FIFO named like a spec (`data.yaml`, `cloudtrain.yaml`), or a link to one,
  is never opened; each command says what it skipped, or refuses it (exit 2) where the user named it.

Every case runs the real CLI in its own process, with a timeout: before the fix, the FIFO cases hung until it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.bundle.packaging import EXPORT_MARKER
from tests.conftest import REPO, cli_env
from tests.support import SETTINGS

FIFO_TIMEOUT = 60  # a command that opened a FIFO would wait for a writer forever


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('trained')\n")
    (root / "requirements.txt").write_text("numpy\n")
    return root


def manifest(cli, proj: Path, *flags: str, env_extra: dict[str, str] | None = None) -> dict:
    out = cli("plan", "train.py", *flags, "-o", "json", cwd=proj, env_extra=env_extra, timeout=FIFO_TIMEOUT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def shipped(plan: dict) -> set[str]:
    return {f["path"] for f in plan["package"]["files"]}


# -- 28.4: exports and cloudtrain's own files never ship -----------------------------------------------------------


def test_an_export_inside_the_project_is_left_out_of_the_next_bundle(cli, ct_home: Path, proj: Path) -> None:
    env = {**cli_env(ct_home), **SETTINGS}
    exported = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train.py", "-p", "aws", "--env",
                               "WANDB_API_KEY=wandb-secret-123456", "--export", "sagemaker"], cwd=proj, env=env,
                              capture_output=True, text=True, timeout=180)
    assert exported.returncode == 0, exported.stderr
    assert (proj / "sagemaker" / EXPORT_MARKER).is_file()
    assert "wandb-secret-123456" in (proj / "sagemaker" / "create-training-job.json").read_text()  # runs as is
    plan = manifest(cli, proj, env_extra=SETTINGS)
    assert not any(path.startswith("sagemaker/") for path in shipped(plan)), shipped(plan)
    assert "sagemaker/" in plan["package"]["left_out"]
    assert any(note.startswith("package: left out sagemaker/ (written by `cloudtrain plan --export`")
               for note in plan["notes"]), plan["notes"]


def test_cloudtrains_own_stores_inside_the_project_are_left_out(cli, proj: Path) -> None:
    """Its home (job records, node logs, the local store with staged bundles) and a file:// checkpoint or output
    store, when they lie in the project; a plan saved as YAML there too."""
    home = proj / "ct"
    env = {"CLOUDTRAIN_HOME": str(home)}
    (home / "jobs" / "old-job").mkdir(parents=True)
    (home / "jobs" / "old-job" / "node-0.log").write_text("logs of an earlier job\n")
    (proj / "ckpt" / "step-1").mkdir(parents=True)
    (proj / "ckpt" / "step-1" / "state.pt").write_bytes(b"weights")
    saved = cli("plan", "train.py", "-o", "yaml", cwd=proj, env_extra=env)
    assert saved.returncode == 0, saved.stderr
    (proj / "reviewed-plan.yaml").write_text(saved.stdout)
    plan = manifest(cli, proj, "--checkpoint-uri", (proj / "ckpt").as_uri(), env_extra=env)
    assert shipped(plan) == {"train.py", "requirements.txt"}, shipped(plan)
    assert {"ct/", "ckpt/", "reviewed-plan.yaml"} <= set(plan["package"]["left_out"])
    [note] = [note for note in plan["notes"] if note.startswith("package: left out")]  # one line, however many
    assert note.startswith("package: left out 1 file and 2 folders: ckpt/ (the job's checkpoint store"), note
    assert "; ct/ (cloudtrain's home" in note and "; reviewed-plan.yaml (a cloudtrain spec file" in note


# -- 28.8: the script is in the package --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "flags", "needle"),
    [({".gitignore": "# build outputs\n*.py\n!setup.py\n"}, [],
      "script: script train.py is not in the package: train.py is ignored by .gitignore line 2 (`*.py`)"),
     ({".cloudtrainignore": "/train.py\n"}, [],
      "train.py is ignored by .cloudtrainignore line 1 (`/train.py`)"),
     ({".gitignore": "req*.txt\n"}, ["--set", "requirements=requirements.txt"],
      "requirements: requirements file requirements.txt is not in the package: requirements.txt is ignored by "
      ".gitignore line 1 (`req*.txt`)"),
     ({"pkg/.gitignore": "train*\n", "pkg/__init__.py": ""}, ["--no-spec"], "pkg/train.py is ignored by "
      "pkg/.gitignore line 1 (`train*`)")],
    ids=["gitignore", "cloudtrainignore", "requirements", "nested"])
def test_an_ignore_rule_that_drops_the_entry_point_is_refused_naming_it(cli, proj: Path, files: dict[str, str],
                                                                        flags: list[str], needle: str) -> None:
    for name, text in files.items():
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text(text)
    target = ["train.py"]
    if "nested" in needle or "pkg/" in needle:
        (proj / "pkg" / "train.py").write_text("print('trained')\n")
        target = ["-m", "pkg.train", "--source-dir", str(proj)]
    out = cli("plan", *target, *flags, cwd=proj)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert needle in out.stderr, out.stderr
    assert "fix: remove or narrow that rule, or re-include it with a line `!" in out.stderr


def test_a_re_included_script_and_a_script_in_an_excluded_folder(cli, proj: Path) -> None:
    (proj / ".gitignore").write_text("*.py\n")
    (proj / ".cloudtrainignore").write_text("!train.py\n")  # read after .gitignore: the last match wins
    assert "train.py" in shipped(manifest(cli, proj))
    (proj / "build").mkdir()
    (proj / "build" / "train.py").write_text("print(1)\n")
    out = cli("plan", "build/train.py", "--source-dir", str(proj), cwd=proj)
    assert out.returncode == 2 and "build/ is never packaged (a built-in exclude" in out.stderr, out.stderr


# -- 28.10: special files never hang a command -------------------------------------------------------------------


def test_fifos_named_like_specs_are_never_opened_and_are_named(cli, proj: Path) -> None:
    os.mkfifo(proj / "data.yaml")
    os.mkfifo(proj / "cloudtrain.yaml")
    (proj / "conf").mkdir()
    os.mkfifo(proj / "conf" / "pipe")
    (proj / "saved.json").symlink_to(proj / "conf" / "pipe")  # a link to a FIFO, named like a saved plan
    out = cli("plan", "train.py", "-o", "json", cwd=proj, timeout=FIFO_TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert "note: ./cloudtrain.yaml is a FIFO (named pipe), not a regular file: skipped (not read)" in out.stderr
    plan = json.loads(out.stdout)
    assert shipped(plan) == {"train.py", "requirements.txt"}
    assert "package: left out 4 files: cloudtrain.yaml, conf/pipe, data.yaml, saved.json (a FIFO (named pipe), not " \
           "a regular file: never read or packaged)" in plan["notes"], plan["notes"]


@pytest.mark.parametrize("command", [["plan", "-f", "data.yaml"], ["submit", "--plan", "data.yaml"],
                                     ["plan", "data.yaml"], ["config", "show"], ["doctor", "-p", "local"]],
                         ids=["spec", "saved-plan", "script", "config", "doctor"])
def test_a_fifo_where_a_file_is_read_is_refused_or_skipped_never_waited_on(cli, ct_home: Path, proj: Path,
                                                                            command: list[str]) -> None:
    os.mkfifo(proj / "data.yaml")
    config = proj / "config.yaml"
    os.mkfifo(config)
    try:
        out = cli(*command, cwd=proj, timeout=FIFO_TIMEOUT, env_extra={"CLOUDTRAIN_CONFIG": str(config)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"`cloudtrain {' '.join(command)}` waited on a FIFO")
    assert "Traceback" not in out.stderr, out.stderr
    if command[0] == "doctor":  # a report: the config is named as unreadable, the command ends
        assert "config" in out.stdout + out.stderr
        return
    assert out.returncode == 2, out.stdout + out.stderr
    named = "config.yaml" if command[0] == "config" else "data.yaml"
    assert named in out.stderr and "a FIFO (named pipe), not a regular file" in out.stderr, out.stderr


def test_init_never_writes_into_a_fifo(cli, proj: Path) -> None:
    os.mkfifo(proj / "cloudtrain.yaml")
    out = cli("init", "--force", cwd=proj, timeout=FIFO_TIMEOUT)
    assert out.returncode == 2 and "cloudtrain.yaml is a FIFO (named pipe), not a regular file" in out.stderr


def test_the_reader_refuses_a_file_swapped_for_a_fifo(tmp_path: Path) -> None:
    """The check is made on what was opened (O_NONBLOCK, then fstat), not only on the name before."""
    from cloudtrain.regular_files import NotRegularFile, open_regular, special

    fifo = tmp_path / "x.yaml"
    os.mkfifo(fifo)
    assert special(fifo) == "a FIFO (named pipe)" and special(tmp_path) is None
    with pytest.raises(NotRegularFile) as info:
        open_regular(fifo)
    assert info.value.filename == str(fifo) and isinstance(info.value, OSError)
    code = ("import os, sys; from cloudtrain import regular_files as r; r.special = lambda p: None\n"
            "try:\n    r.open_regular(sys.argv[1])\nexcept OSError as e:\n    print(e.strerror)")
    out = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "a FIFO (named pipe), not a regular file", out.stderr
