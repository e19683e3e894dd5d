"""Trains without ever joining a process group: every rank works alone, and each exits 0 (a hollow run)."""

import os

import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: trained alone, loss {loss.item():.3f}", flush=True)
