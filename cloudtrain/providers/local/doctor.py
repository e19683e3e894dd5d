"""`cloudtrain doctor` for local jobs: torch, which every node imports."""

from __future__ import annotations

from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import Context, extra_check


def checks(ctx: Context) -> list[Check]:
    return [extra_check("local", "torch", " (or the torch build for your CUDA version: https://pytorch.org)")]
