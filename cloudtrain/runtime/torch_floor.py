"""Imported before the Checkpointer's torch imports: on a torch older than it runs on, the process stops with one
line that says so and the fix, not with an ImportError from deep in torch (torch 2.2 has no DCP ``FileSystem``)."""

from __future__ import annotations

import torch

from cloudtrain.contract import RUNTIME_MIN_TORCH


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())


if _key(torch.__version__) < _key(RUNTIME_MIN_TORCH):
    raise ImportError(f"cloudtrain.runtime's Checkpointer needs torch {RUNTIME_MIN_TORCH} or newer; this process "
                      f"runs torch {torch.__version__}: choose image.torch_version {RUNTIME_MIN_TORCH} or newer "
                      "(docs/images.md), or save checkpoints with your own code (checkpoint.dir)")
