"""What karpathy/nanoGPT's train.py does, in miniature (a tiny GPT-like model on synthetic tokens, CPU + gloo).

Like nanoGPT: globals overridden by ``--key=value`` flags (its configurator), DDP when torchrun sets RANK, gradient
accumulation split across ranks, AdamW + warmup/cosine lr, and at every ``eval_interval`` the master process
evaluates and ``torch.save``s ONE dict {model, optimizer, model_args, iter_num, best_val_loss, config} to
``out_dir/ckpt.pt``, overwriting it in place (not atomic: a kill mid-save leaves a truncated zip). It resumes only
with ``--init_from=resume``, which crashes (FileNotFoundError) when ckpt.pt is missing. As in nanoGPT the loop runs
iterations 0..max_iters, so it ends after max_iters + 1 optimizer steps, and the checkpoint saved "at" iteration N
holds the model after N steps.

One deliberate difference: nanoGPT draws batches from the global torch RNG, which its checkpoint does not hold, so its
resumed run sees other batches than an uninterrupted one. Here each batch is drawn from a generator keyed by
(iteration, micro step, rank), so a resumed run is bitwise equal to an uninterrupted one.

Extra flags: ``--ckpt_mb=N`` adds an N MiB buffer to the saved dict (so a test can kill the process mid-write;
``[byo] saving step N`` is printed just before each torch.save) and ``--step_sleep=S``.

    torchrun --nproc-per-node 2 nanogpt_style.py --out_dir=OUT --max_iters=12 --eval_interval=4
    torchrun --nproc-per-node 2 nanogpt_style.py --out_dir=OUT --max_iters=12 --eval_interval=4 --init_from=resume
"""

import hashlib
import math
import os
import sys
import time
from ast import literal_eval

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# default config values (nanoGPT's names; tiny sizes)
out_dir = "out"
eval_interval = 4
log_interval = 1
eval_iters = 2
eval_only = False
always_save_checkpoint = True
init_from = "scratch"  # 'scratch' or 'resume'
gradient_accumulation_steps = 2
batch_size = 4
block_size = 16
vocab_size = 64
n_layer = 1
n_head = 2
n_embd = 32
dropout = 0.0
bias = False
learning_rate = 1e-3
max_iters = 12
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 2
lr_decay_iters = 12
min_lr = 1e-4
backend = "gloo"
device = "cpu"
compile = False
ckpt_mb = 1  # extra MiB in each checkpoint (not nanoGPT's): makes a save slow enough to be killed mid-write
step_sleep = 0.0  # seconds to sleep after each iteration (not nanoGPT's)
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
# nanoGPT's configurator.py, inlined: --key=value overrides a global of the same type
for arg in sys.argv[1:]:
    assert arg.startswith("--") and "=" in arg, f"expected --key=value, got {arg!r}"
    key, val = arg[2:].split("=", 1)
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    if isinstance(globals()[key], float) and isinstance(attempt, int):
        attempt = float(attempt)
    assert type(attempt) is type(globals()[key]), f"{key}: {attempt!r} is not a {type(globals()[key]).__name__}"
    globals()[key] = attempt
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout, bias):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, bias=bias, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=bias), nn.Dropout(dropout))

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def params_digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# various inits, derived attributes, I/O setup
ddp = int(os.environ.get("RANK", -1)) != -1  # is this a ddp run?
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank  # each process gets a different seed
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
if master_process:
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)

# the data: nanoGPT memory-maps train.bin / val.bin; here a fixed synthetic token stream
_stream = torch.randint(0, vocab_size, (20000,), generator=torch.Generator().manual_seed(7))
train_data, val_data = _stream[:18000], _stream[18000:]


def get_batch(split, it, k):
    # nanoGPT: ix = torch.randint(len(data) - block_size, (batch_size,)) from the global RNG. Keyed by (split,
    # iteration, micro step or eval batch, rank) instead: a resumed run draws the same batches as an uninterrupted one.
    data = train_data if split == "train" else val_data
    g = torch.Generator().manual_seed((((split == "val") * 1_000_003 + it) * 10_007 + k) * 1_031 + seed_offset)
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=g)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


iter_num = 0
best_val_loss = 1e9
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=vocab_size, dropout=dropout)
if init_from == "scratch":
    model = GPT(**model_args)
elif init_from == "resume":
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    checkpoint = torch.load(ckpt_path, map_location=device)  # no ckpt.pt: FileNotFoundError, as in nanoGPT
    for k in ["n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"]:
        model_args[k] = checkpoint["model_args"][k]
    model = GPT(**model_args)
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k in list(state_dict):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
    if master_process:
        print(f"[byo] resumed from step {iter_num}", flush=True)
else:
    raise ValueError(f"init_from={init_from!r}")
model.to(device)

optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))
if init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None  # free up memory

if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split, iter_num, 1000 + k)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# training loop
X, Y = get_batch("train", iter_num, 0)  # fetch the very first batch
t0 = time.time()
local_iter_num = 0
raw_model = model.module if ddp else model
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    # evaluate the loss on train/val sets and write checkpoints
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": config,
                }
                if ckpt_mb:
                    checkpoint["padding"] = torch.ones(ckpt_mb * 2**20, dtype=torch.uint8)
                print(f"saving checkpoint to {out_dir}", flush=True)
                print(f"[byo] saving step {iter_num}", flush=True)
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
                checkpoint = None
        if local_iter_num > 0:  # the step line of an eval iteration waits until its checkpoint is written
            print(f"[byo] step {iter_num}", flush=True)
    if iter_num == 0 and eval_only:
        break

    # forward backward update, with optional gradient accumulation to simulate larger batch size
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train", iter_num, micro_step + 1)  # prefetch the next micro batch
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # the next iteration's first batch (nanoGPT's last prefetch would be it; keyed by the next iteration here)
    X, Y = get_batch("train", iter_num + 1, 0)

    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % log_interval == 0 and master_process:
        print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, time {dt * 1000:.2f}ms",
              flush=True)
    iter_num += 1
    local_iter_num += 1
    if master_process and (iter_num % eval_interval != 0 or iter_num > max_iters):
        print(f"[byo] step {iter_num}", flush=True)
    if step_sleep:
        time.sleep(step_sleep)

    # termination conditions
    if iter_num > max_iters:
        break

if master_process:
    print(f"[byo] done step {iter_num} params {params_digest(raw_model)}", flush=True)
if ddp:
    destroy_process_group()
