"""Helpers for code running inside a job. Importable on a node with nothing but torch (no cloud SDK).

    ctx = init_distributed()
    seed_everything(0)
    model = wrap_model(Model(), ctx)                       # DDP or FSDP2, from the job's strategy
    sampler = ResumableSampler(len(data), ctx.rank, ctx.world_size, seed=0)
    ckpt = Checkpointer(model, opt, sampler=sampler)       # URI, interval, retention from the job spec
    step = ckpt.restore()
    ... after each optimizer step: step += 1; sampler.advance(batch); ckpt.step(step)
"""

from cloudtrain.runtime.distributed import DistContext, init_distributed, shutdown

__all__ = ["Checkpointer", "DistContext", "Preempted", "ResumableSampler", "get_logger", "init_distributed",
           "make_loader", "save_final_model", "seed_everything", "shutdown", "wrap_model"]

_LAZY = {
    "Checkpointer": "cloudtrain.runtime.checkpointer",
    "Preempted": "cloudtrain.runtime.checkpointer",
    "save_final_model": "cloudtrain.runtime.checkpointer",
    "ResumableSampler": "cloudtrain.runtime.data",
    "make_loader": "cloudtrain.runtime.data",
    "get_logger": "cloudtrain.runtime.logs",
    "seed_everything": "cloudtrain.runtime.rng",
    "wrap_model": "cloudtrain.runtime.model",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cloudtrain.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
