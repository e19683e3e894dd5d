"""A GPT-like model trained on random tokens, timing each step: the script benchmarks/gpu_goodput.py runs under bare
torchrun and under cloudtrain (the same file, the same arguments). No downloads, no cloudtrain imports.

    torchrun --standalone --nproc-per-node 1 gpt_steps.py --steps 200 --out steps.json

Writes ``{"step_seconds": [...], "threads": N, "device": "..."}`` to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), diagonal=1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cuda = torch.cuda.is_available() and os.environ.get("CLOUDTRAIN_FORCE_CPU") != "1"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.width, args.depth, args.heads, args.context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator(device="cpu").manual_seed(0)
    times = []
    for step in range(args.warmup + args.steps):
        idx = torch.randint(args.vocab, (args.batch, args.context + 1), generator=g).to(device, non_blocking=True)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump({"step_seconds": times, "threads": torch.get_num_threads(), "device": str(device),
                       "omp": os.environ.get("OMP_NUM_THREADS"), "env": sorted(os.environ),
                       "modules": len(sys.modules), "affinity": len(os.sched_getaffinity(0)),
                       "pythonpath": os.environ.get("PYTHONPATH")}, f)


if __name__ == "__main__":
    main()
