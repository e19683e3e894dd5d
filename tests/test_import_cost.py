"""`cloudtrain --help` must start instantly: no provider SDK, no torch, not even pydantic."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("torch", "boto3", "botocore", "sagemaker", "azure", "google", "pydantic", "yaml")


def imported_modules(code: str) -> set[str]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
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
