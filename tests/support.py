"""Helpers test modules share (no test module imports another): the CLI bound to a home, the interrupted-run
arguments and the weight comparisons of the resume tests (tests/test_resume.py, test_fallback.py, ...)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tests.conftest import cli_env

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
