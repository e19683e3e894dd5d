"""Seeding, and capture/restore of every RNG a training step may touch (per rank)."""

from __future__ import annotations

import random
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # numpy is optional inside a job
    np = None  # type: ignore[assignment]


def seed_everything(seed: int) -> None:
    """Same seed on every rank: identical initial weights (FSDP shards them, DDP would broadcast anyway)."""
    random.seed(seed)
    torch.manual_seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
