"""Helpers for code running inside a job. Importable on a node with nothing but torch (no cloud SDK).

    ctx = init_distributed()
    seed_everything(0)
    model = wrap_model(Model(), ctx)                       # DDP or FSDP2, from the job's strategy
    sampler = ResumableSampler(len(data), ctx.rank, ctx.world_size, seed=0)
    ckpt = Checkpointer(model, opt, sampler=sampler)       # URI, interval, retention from the job spec
    step = ckpt.restore()
    ... after each optimizer step: step += 1; sampler.advance(batch); ckpt.step(step); report_step(step, total)
"""

from typing import TYPE_CHECKING

from cloudtrain._lazy import lazy_exports
from cloudtrain.runtime.distributed import DistContext, init_distributed, shutdown

if TYPE_CHECKING:  # torch-heavy modules load on first use
    from cloudtrain.runtime.checkpointer import Checkpointer, Preempted, save_final_model
    from cloudtrain.runtime.data import ResumableSampler, make_loader
    from cloudtrain.runtime.logs import get_logger
    from cloudtrain.runtime.model import wrap_model
    from cloudtrain.runtime.report import report_step
    from cloudtrain.runtime.rng import seed_everything

__all__ = ["Checkpointer", "DistContext", "Preempted", "ResumableSampler", "get_logger", "init_distributed",
           "make_loader", "report_step", "save_final_model", "seed_everything", "shutdown", "wrap_model"]

__getattr__ = lazy_exports(__name__, {
    "Checkpointer": "cloudtrain.runtime.checkpointer",
    "Preempted": "cloudtrain.runtime.checkpointer",
    "save_final_model": "cloudtrain.runtime.checkpointer",
    "ResumableSampler": "cloudtrain.runtime.data",
    "make_loader": "cloudtrain.runtime.data",
    "get_logger": "cloudtrain.runtime.logs",
    "seed_everything": "cloudtrain.runtime.rng",
    "wrap_model": "cloudtrain.runtime.model",
    "report_step": "cloudtrain.runtime.report",
})
