"""cloudtrain: one PyTorch training script, run as a multi-node DDP/FSDP job on SageMaker, Azure ML, Vertex AI or
locally, with checkpoints that survive preemption.

Importing ``cloudtrain`` is cheap: the SDK, torch and provider SDKs load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain._lazy import lazy_exports

__version__ = "0.1.0"
__all__ = ["CloudtrainError", "Job", "JobSpec", "Run", "__version__", "list_runs"]

if TYPE_CHECKING:
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.sdk import Job, Run, list_runs
    from cloudtrain.spec.model import JobSpec

__getattr__ = lazy_exports(__name__, {
    "Job": "cloudtrain.sdk",
    "Run": "cloudtrain.sdk",
    "list_runs": "cloudtrain.sdk",
    "JobSpec": "cloudtrain.spec.model",
    "CloudtrainError": "cloudtrain.errors",
})
