"""A plain Lightning script (``import lightning as L``) with ``ModelCheckpoint``; nothing cloudtrain-specific.

Under torchrun Lightning detects the torchelastic environment (``TorchElasticEnvironment``) and joins the processes
torchrun started instead of spawning its own; ``devices``/``num_nodes`` only have to agree with torchrun's layout, so
they are read from LOCAL_WORLD_SIZE / WORLD_SIZE. ``ModelCheckpoint(every_n_train_steps=K, save_last=True,
save_top_k=-1)`` writes ``CKPT_DIR/epoch=E-step=S.ckpt`` and ``CKPT_DIR/last.ckpt`` from global rank 0.
``--ckpt_path last`` resumes from ``last.ckpt`` (Lightning warns and starts fresh when there is none); a path resumes
from that file.

    torchrun --nproc-per-node 2 lightning_ckpt.py --ckpt_dir CK --max_steps 12 --every 4
    torchrun --nproc-per-node 2 lightning_ckpt.py --ckpt_dir CK --max_steps 12 --every 4 --ckpt_path last
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH = 8


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Regressor(L.LightningModule):
    def __init__(self, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.step_sleep = step_sleep
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_start(self) -> None:
        # trainer.ckpt_path is the checkpoint fit() restored from (None when it started fresh)
        if self.trainer.ckpt_path and self.trainer.is_global_zero:
            print(f"[byo] resumed from step {self.global_step}", flush=True)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # runs after the optimizer step and after callbacks' on_train_batch_end (ModelCheckpoint saves there)
        if self.trainer.is_global_zero:
            print(f"[byo] step {self.global_step}", flush=True)
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def synthetic(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=g)
    return TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.05 * torch.randn(samples, 1, generator=g))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt_dir", required=True)
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--ckpt_path", default=None, help='passed to trainer.fit(ckpt_path=...): "last" or a file')
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=None,
                   help="dataset size; default: an epoch is --every steps, so each checkpoint is at an epoch end")
    args = p.parse_args()

    L.seed_everything(0)
    # torchrun's layout: LOCAL_WORLD_SIZE processes on each of WORLD_SIZE / LOCAL_WORLD_SIZE nodes.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=local_world,
        num_nodes=world // local_world,
        strategy="ddp" if world > 1 else "auto",
        max_steps=args.max_steps,
        max_epochs=-1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=args.ckpt_dir,
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_last=True,
                                   save_top_k=-1)],
    )
    # Lightning resumes exactly only from an end-of-epoch checkpoint when the DataLoader is not "resumable" (has no
    # state_dict/load_state_dict): from a mid-epoch one it warns and replays the epoch from its first batch. So by
    # default an epoch is exactly --every steps. shuffle=False: a plain DataLoader's RandomSampler draws from the
    # global RNG, which the checkpoint does not hold (under DDP Lightning swaps in a DistributedSampler, unshuffled).
    samples = args.samples or args.every * BATCH * world
    loader = DataLoader(synthetic(samples), batch_size=BATCH, shuffle=False)
    model = Regressor(args.step_sleep)
    trainer.fit(model, loader, ckpt_path=args.ckpt_path)
    if trainer.is_global_zero:
        print(f"[byo] done step {trainer.global_step} params {params_digest(model)}", flush=True)


if __name__ == "__main__":
    main()
