"""`cloudtrain --help` must start instantly: no provider SDK, no torch, not even pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

HEAVY = ("torch", "boto3", "botocore", "sagemaker", "azure", "google", "pydantic", "yaml")


def imported_modules(code: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> set[str]:
    """Every module a fresh interpreter imports to run ``code``."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            cwd=cwd, env=env, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "cloudtrain" in names  # the probe itself works
    return names


def test_cli_import_pulls_in_nothing_heavy() -> None:
    names = imported_modules("import cloudtrain.cli.main")
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == []


def test_help_pulls_in_nothing_heavy() -> None:
    code = "import sys; from cloudtrain.cli.main import main\ntry: main(['--help'])\nexcept SystemExit: pass"
    names = imported_modules(code)
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []


def test_sdk_import_is_lazy() -> None:
    names = imported_modules("import cloudtrain; cloudtrain.__version__")
    assert not any(n.split(".")[0] in HEAVY for n in names)


def test_a_plan_with_no_yaml_to_read_does_not_load_yaml(tmp_path: Path) -> None:
    """A project without cloudtrain.yaml and a machine without a config file: yaml is never imported (it was, at
    every start, for ~15 ms of a local job's ~0.3 s CLI phase)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "CLOUDTRAIN_CONFIG": str(tmp_path / "none.yaml"),
           "PYTHONPATH": str(REPO)}
    code = "from cloudtrain.cli.main import main\nraise SystemExit(main(['plan', 'train.py', '--provider', 'local']))"
    names = imported_modules(code, cwd=tmp_path, env=env)
    assert "cloudtrain.spec" in names  # the plan really ran
    assert not [n for n in names if n.split(".")[0] == "yaml"]
