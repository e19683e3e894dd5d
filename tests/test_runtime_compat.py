"""The runtime helpers run on the torch of every image cloudtrain picks, not only the newest."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_fsdp2_found_where_torch_2_4_and_2_5_keep_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed._composable.fsdp as composable
    import torch.distributed.fsdp as public

    from cloudtrain.runtime.model import fsdp2_api

    if hasattr(public, "fully_shard"):  # torch >= 2.6; `nox -s compat` runs this on 2.4, which has no public names
        assert fsdp2_api() == (public.fully_shard, public.MixedPrecisionPolicy)
        # torch 2.4/2.5 (the default image on Vertex, and on SageMaker/Azure for torch_version 2.5)
        monkeypatch.delattr(public, "fully_shard")
        monkeypatch.delattr(public, "MixedPrecisionPolicy")
    assert fsdp2_api() == (composable.fully_shard, composable.MixedPrecisionPolicy)


def test_the_checkpointer_on_a_torch_too_old_for_it_says_so_and_the_fix() -> None:
    """torch 2.2 (an image every cloud has) failed in the worker with `cannot import name 'FileSystem'` from torch's
    DCP: the import now stops with the version it needs and the fix."""
    import subprocess
    import sys

    from cloudtrain.contract import RUNTIME_MIN_TORCH
    from tests.conftest import REPO

    old = subprocess.run([sys.executable, "-c", "import torch; torch.__version__ = '2.2.2+cu121'\n"
                          "from cloudtrain.runtime import Checkpointer"], capture_output=True, text=True, cwd=REPO)
    assert old.returncode == 1 and old.stderr.splitlines()[-1] == (
        f"ImportError: cloudtrain.runtime's Checkpointer needs torch {RUNTIME_MIN_TORCH} or newer; this process runs "
        f"torch 2.2.2+cu121: choose image.torch_version {RUNTIME_MIN_TORCH} or newer (docs/images.md), or save "
        "checkpoints with your own code (checkpoint.dir)"), old.stderr[-2000:]
    supported = subprocess.run([sys.executable, "-c", f"import torch; torch.__version__ = '{RUNTIME_MIN_TORCH}.0'\n"
                                "from cloudtrain.runtime import Checkpointer"], capture_output=True, text=True,
                               cwd=REPO)
    assert supported.returncode == 0, supported.stderr[-2000:]
