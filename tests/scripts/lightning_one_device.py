"""A LightningModule trained with Trainer(devices=1), as many notebooks write it: under torchrun every process runs
a whole training of its own (no process group), and each exits 0."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regression(), data)
