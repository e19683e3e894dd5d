"""Helpers for code running inside a job. Importable on a node with nothing but torch (no cloud SDK)."""

from cloudtrain.runtime.distributed import DistContext, init_distributed, shutdown

__all__ = ["DistContext", "init_distributed", "shutdown"]
