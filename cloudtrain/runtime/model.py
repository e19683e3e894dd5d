"""Wrap a model for the job's strategy: DDP, or FSDP2 (``fully_shard`` per block, optional bf16 mixed precision)."""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=None)  # not functools.cache: workers may run Python 3.8 (Azure's torch 2.1)
def ddp_class() -> type:
    """DDP whose reducer lists the parameters last one first, the order their gradients usually arrive in, so that
    buckets laid out in the reducer's order are reduced while the backward pass still runs."""
    from torch.nn.parallel import DistributedDataParallel

    class DDPGradientOrder(DistributedDataParallel):
        def _build_params_for_reducer(self) -> tuple[list[Any], list[bool]]:
            params, expect_sparse = super()._build_params_for_reducer()
            return params[::-1], expect_sparse[::-1]

    return DDPGradientOrder


def fix_bucket_layout(ddp: Any) -> None:
    """Lay DDP's gradient buckets out now, as they will stay, identically in every process that wraps the model.

    torch reduces a process's first step in one bucket in parameter order, then lays the buckets out again in the
    order the gradients arrived. With more than 2 ranks the ring all-reduce sums each element in an order set by its
    position in its bucket, so the first step after a resume came out ~1 ulp away from the same step of an
    uninterrupted run. Here the layout follows the reducer's parameter order (torch's 1 MB first bucket, then
    ``bucket_cap_mb``) from the first step on; with ``ddp_class()`` that order is the usual arrival order."""
    ddp.reducer._push_all_rebuilt_params()  # what DDP's own join hook calls; the rebuild then uses that order
    ddp.reducer._rebuild_buckets()


def deterministic_ddp(model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
    """``DistributedDataParallel(model, **ddp_kwargs)`` whose steps all reduce alike, in every process: resumed from a
    checkpoint, it ends bitwise equal to an uninterrupted run at any world size. Same buckets as torch's own after
    its first step when gradients arrive last parameter first; no cost per step (benchmarks/ddp_buckets.py)."""
    if ddp_kwargs.get("find_unused_parameters") and not ddp_kwargs.get("static_graph"):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, **ddp_kwargs)  # torch keeps this layout: it never lays it out again
    ddp = ddp_class()(model, **ddp_kwargs)
    fix_bucket_layout(ddp)
    return ddp


def wrap_model(model: nn.Module, ctx: DistContext, strategy: str | None = None, *, bf16: bool = False,
               blocks: list[nn.Module] | None = None) -> nn.Module:
    strategy = strategy or os.environ.get(contract.STRATEGY, "ddp")
    model = model.to(ctx.device)
    if strategy == "ddp":
        return deterministic_ddp(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
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
