"""Restore the newest checkpoint into an FSDP2 model on this world size; print a digest of the full weights."""

import hashlib

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from train_fsdp import Model

from cloudtrain.runtime import Checkpointer, init_distributed, shutdown, wrap_model

ctx = init_distributed()
torch.manual_seed(123)  # different init from training: only a real restore makes the digests agree
model = wrap_model(Model(16, 64, 4), ctx, "fsdp")
opt = torch.optim.AdamW(model.parameters(), lr=0.003)
step = Checkpointer(model, opt).restore()
state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if ctx.rank == 0:
    digest = hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state))).hexdigest()
    print(f"restored step={step} world_size={ctx.world_size} weights={digest}", flush=True)
shutdown()
