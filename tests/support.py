"""Helpers test modules share (no test module imports another): the CLI bound to a home, the interrupted-run
arguments and the weight comparisons of the resume tests (tests/test_resume.py, test_fallback.py, ...), offline
provider settings, a project tree to package, secret-shaped strings, an isolated settings file, the modules a fresh
interpreter imports, and the provider guide's sections."""

from __future__ import annotations

import json
import random
import re
import shutil
import string
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import REPO, cli_env

if TYPE_CHECKING:
    import torch

ARGS = ["--", "--epochs", "2", "--checkpoint-every", "8"]
# interrupted runs only: time to interrupt them mid-way (it changes no arithmetic). FSDP's run is 32 steps: at 0.15 s
# a step, a loaded machine published step 16 less than 2.4 s before step 32 and the kill came after the end
SLOW = {"ddp": ["--step-sleep", "0.15"], "fsdp": ["--step-sleep", "0.3"]}


class Cloudtrain:
    """The CLI as a user runs it, bound to one cloudtrain home."""

    def __init__(self, home: Path, cwd: Path) -> None:
        self.home, self.cwd = home, cwd

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=self.cwd, env=cli_env(self.home),
                                capture_output=True, text=True, timeout=300)
        if check:
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    def logs(self, handle: str) -> str:
        return self("logs", handle).stdout

    def status(self, handle: str) -> dict:
        return json.loads(self("status", handle, "-o", "json").stdout)


def final_weights(output_uri: str) -> dict[str, torch.Tensor]:
    import torch

    return torch.load(Path(output_uri.removeprefix("file://")) / "model.pt", weights_only=True)


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


# what plans for aws and gcp offline need (test_export, test_package_guard, test_secrets)
SETTINGS = {"AWS_REGION": "eu-west-1", "CLOUDTRAIN_AWS_ROLE": "arn:aws:iam::123456789012:role/cloudtrain",
            "CLOUDTRAIN_AWS_BUCKET": "my-bucket", "CLOUDTRAIN_GCP_PROJECT": "my-project",
            "CLOUDTRAIN_GCP_BUCKET": "my-bucket", "CLOUDTRAIN_GCP_REGION": "europe-west4"}


def make_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (root / ".env.example").write_text("TOKEN=\n")
    return root


ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


def rand(n: int, alphabet: str = ALNUM, seed: int = 7) -> str:
    rng = random.Random(seed * 1000 + n)
    return "".join(rng.choice(alphabet) for _ in range(n))


def aws_key_id() -> str:
    return "AK" + "IA" + rand(16, string.ascii_uppercase + "234567")


def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """test_config's `cfg` fixture's work: an empty settings file, no provider settings in the environment, no
    AWS/gcloud config of this machine, a project folder as the working directory."""
    from cloudtrain import registry
    from cloudtrain.spec import settings as config

    path = tmp_path / "config.yaml"
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(path))
    for provider in registry.BUILTIN:
        for names_of_key in registry.declaration(provider).env.values():
            for name in names_of_key:
                monkeypatch.delenv(name, raising=False)
    for name in ("CLOUDTRAIN_PROFILE", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "CLOUDTRAIN_AWS_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws" / "credentials"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "entrypoints" / "train_ddp.py", proj / "train_ddp.py")
    monkeypatch.chdir(proj)
    config.use_profile(None)
    yield path
    config.use_profile(None)  # main(["--profile", ...]) and use_profile() pick a profile for the whole process


def write_config(path: Path, data: dict[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data), encoding="utf-8")


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from cloudtrain.cli.main import main

    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


HEAVY = ("torch", "boto3", "botocore", "sagemaker", "azure", "google", "pydantic", "yaml")

_DUMP = ("import atexit, sys\n"
         "atexit.register(lambda: sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)) + '\\n'))\n")


def imported_modules(code: str, cwd: Path = REPO, env: dict[str, str] | None = None, at_exit: bool = False) -> set[str]:
    """Every module a fresh interpreter imports to run ``code``, as ``-X importtime`` lists them; ``at_exit``: every
    module in sys.modules as it exits (importtime leaves out some imported through importlib, and lists no parent
    package that importlib.util.find_spec imports)."""
    argv = [sys.executable, "-c", _DUMP + code] if at_exit else [sys.executable, "-X", "importtime", "-c", code]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    names = set()
    for line in result.stderr.splitlines():
        if at_exit and line.startswith("MODULES "):
            names.update(line.split()[1:])
        elif line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "cloudtrain" in names  # the probe itself works
    return names


GUIDE = REPO / "docs" / "writing-a-provider.md"


def section(heading: str, doc: Path = GUIDE) -> str:
    text = doc.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def block(heading: str, lang: str = "python", index: int = 0) -> str:
    """The ``index``-th fenced ``lang`` block of a section."""
    return re.findall(rf"```{lang}\n(.*?)```", section(heading), re.S)[index]
