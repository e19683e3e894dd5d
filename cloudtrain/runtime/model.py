"""Wrap a model for the job's strategy: DDP, or FSDP2 (``fully_shard`` per block, optional bf16 mixed precision)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from cloudtrain import contract
from cloudtrain.runtime.distributed import DistContext


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: the items of every ModuleList (transformer layers and the like)."""
    return [block for module in model.modules() if isinstance(module, nn.ModuleList) for block in module]


def fsdp2_api() -> tuple[Any, Any]:
    """``(fully_shard, MixedPrecisionPolicy)``: public in torch.distributed.fsdp from torch 2.6, under
    torch.distributed._composable.fsdp in 2.4 and 2.5 (the default images of some clouds still run those)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def wrap_model(model: nn.Module, ctx: DistContext, strategy: str | None = None, *, bf16: bool = False,
               blocks: list[nn.Module] | None = None) -> nn.Module:
    strategy = strategy or os.environ.get(contract.STRATEGY, "ddp")
    model = model.to(ctx.device)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    if strategy != "fsdp":
        raise ValueError(f"unknown strategy {strategy!r}; expected 'ddp' or 'fsdp'")
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, MixedPrecisionPolicy = fsdp2_api()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    for block in blocks if blocks is not None else default_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)  # per block: its all-gather overlaps the previous compute
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
