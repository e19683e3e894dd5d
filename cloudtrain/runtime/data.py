"""A distributed data order that can resume mid-epoch: (seed, epoch) fix the permutation, ``consumed`` the place."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class ResumableSampler(Sampler[int]):
    """Like DistributedSampler (shuffle, drop the tail so every rank gets as many samples), plus a position.

    Call ``advance(n)`` after consuming ``n`` samples; ``state_dict`` holds the *global* position, so a job resumed
    on a different world size continues at the same place in the epoch.
    """

    def __init__(self, dataset_len: int, rank: int, world_size: int, seed: int = 0, shuffle: bool = True) -> None:
        self.dataset_len, self.rank, self.world_size = dataset_len, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0
        self.consumed = 0  # samples this rank has consumed in the current epoch

    @property
    def per_rank(self) -> int:
        return self.dataset_len // self.world_size

    def __len__(self) -> int:
        return self.per_rank - self.consumed

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def advance(self, samples: int) -> None:
        self.consumed += samples

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_len, generator=g).tolist()
        else:
            order = list(range(self.dataset_len))
        mine = order[: self.per_rank * self.world_size][self.rank :: self.world_size]
        return iter(mine[self.consumed :])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "global_consumed": self.consumed * self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.consumed = int(state["global_consumed"]) // self.world_size


def make_loader(dataset: Dataset[Any], sampler: ResumableSampler, batch_size: int, **kwargs: Any) -> DataLoader[Any]:
    """A DataLoader whose iterator does not draw from the global RNG (it has its own generator), so creating one
    at a resume point leaves the training RNG exactly where an uninterrupted run has it."""
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                      generator=torch.Generator().manual_seed(sampler.seed), **kwargs)
