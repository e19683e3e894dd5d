"""A plain PyTorch Lightning script, Trainer(strategy="ddp"), with nothing cloudtrain-specific in it.

Launched by torchrun (which is what cloudtrain runs on every node), Lightning detects the torchelastic environment
(``TorchElasticEnvironment``: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) and joins the processes torchrun
started instead of spawning its own. It only needs ``devices`` and ``num_nodes`` to agree with torchrun's layout,
so both are read from the environment. ``accelerator="auto"`` gives GPUs/nccl where there are GPUs, CPU/gloo
elsewhere. Lightning adds the DistributedSampler itself.

    cloudtrain submit examples/lightning_ddp.py --procs-per-node 2 -- --epochs 3
"""

from __future__ import annotations

import argparse
import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self, features: int = 16, lr: float = 0.02) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))
        self.epoch_losses: list[float] = []
        self._sum = torch.zeros(())
        self._count = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self._sum = self._sum.to(loss.device) + loss.detach()
        self._count += 1
        return loss

    def on_train_epoch_end(self) -> None:
        # the mean over every rank's batches (all ranks run the same number of batches)
        mean = self.trainer.strategy.reduce(self._sum / max(self._count, 1), reduce_op="mean")
        self.epoch_losses.append(float(mean))
        self._sum, self._count = torch.zeros(()), 0
        if self.trainer.is_global_zero:
            print(f"epoch {self.current_epoch} loss={self.epoch_losses[-1]:.6f}", flush=True)

    def on_train_end(self) -> None:
        # DDP keeps the replicas identical: compare a checksum of every rank's weights
        flat = torch.cat([p.detach().reshape(-1) for p in self.parameters()])
        checksums = self.all_gather(torch.stack([flat.sum(), flat.abs().sum()]))
        equal = bool((checksums == checksums[0]).all()) if checksums.dim() > 1 else True
        if self.trainer.is_global_zero:
            t = self.trainer
            print(f"lightning: world_size={t.world_size} num_nodes={t.num_nodes} devices={t.num_devices} "
                  f"cluster_env={type(t.strategy.cluster_environment).__name__} "
                  f"strategy={type(t.strategy).__name__} backend={torch.distributed.get_backend()} "
                  f"batches_per_rank={t.num_training_batches} weights_equal_across_ranks={equal} "
                  f"loss_first={self.epoch_losses[0]:.6f} loss_last={self.epoch_losses[-1]:.6f}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def synthetic(samples: int, features: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=g)
    return TensorDataset(x, x @ torch.randn(features, 1, generator=g) + 0.05 * torch.randn(samples, 1, generator=g))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()

    pl.seed_everything(0)
    # torchrun's layout: LOCAL_WORLD_SIZE processes on each of WORLD_SIZE / LOCAL_WORLD_SIZE nodes. Lightning
    # checks devices * num_nodes == WORLD_SIZE; "auto" would count GPUs, which is 1 device on a CPU machine.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    devices: int | str = local_world or "auto"
    num_nodes = int(os.environ.get("WORLD_SIZE", "1")) // local_world if local_world else 1
    trainer = pl.Trainer(
        strategy="ddp", accelerator="auto", devices=devices, num_nodes=num_nodes, max_epochs=args.epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    loader = DataLoader(synthetic(args.samples, 16), batch_size=args.batch_size, shuffle=True)
    trainer.fit(Regressor(), loader)


if __name__ == "__main__":
    main()
