"""A plain Hugging Face Accelerate script with ``save_state`` / ``load_state``; nothing cloudtrain-specific.

``Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True,
total_limit=3))``: under torchrun it joins torchrun's processes (gloo on CPU) and wraps the model in DDP.
``save_state()`` writes ``PROJECT_DIR/checkpoints/checkpoint_<i>/`` (i = 0, 1, ...: a save counter, not the step) and
deletes the oldest beyond ``total_limit``. The step lives in a small object registered with
``register_for_checkpointing`` (``custom_checkpoint_0.pkl``). ``--resume`` calls ``load_state()``, which loads the
highest-numbered ``checkpoint_<i>`` (and fails when there is none), then skips the batches already seen in the current
epoch with ``accelerator.skip_first_batches``, as Accelerate's docs do.

    torchrun --nproc-per-node 2 accelerate_ckpt.py --project_dir P --max_steps 12 --save_every 4
    torchrun --nproc-per-node 2 accelerate_ckpt.py --project_dir P --max_steps 12 --save_every 4 --resume
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import time

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Progress:
    """The training step, checkpointed by Accelerate as a custom object (state_dict / load_state_dict)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def synthetic(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=g)
    return TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.05 * torch.randn(samples, 1, generator=g))


def pause_before_optimizer(at: int, seconds: float) -> None:
    """Rank 0 sleeps before writing optimizer.bin of save number ``at``: Accelerate's save_state writes the model,
    then each optimizer, through ``accelerate.checkpointing.save`` (the library is wrapped here, not modified)."""
    import accelerate.checkpointing as checkpointing

    write, saves = checkpointing.save, [0]

    def save(obj, f, *args, **kwargs):
        name = os.path.basename(str(f))
        if name.startswith("model"):
            saves[0] += 1
        if name.startswith("optimizer") and saves[0] - 1 == at and os.environ.get("RANK", "0") == "0":
            print(f"[byo] pausing {seconds:g}s before {name}", flush=True)
            time.sleep(seconds)
        return write(obj, f, *args, **kwargs)

    checkpointing.save = save


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--project_dir", required=True)
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--save_every", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="load_state() of the newest checkpoint_<i>")
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--pause_optimizer_at", type=int, default=-1,
                   help="at this save_state (0, 1, ...), rank 0 pauses --pause_s between the model and the optimizer "
                        "(what a gather of the optimizer's state does)")
    p.add_argument("--pause_s", type=float, default=0.0)
    args = p.parse_args()
    if args.pause_optimizer_at >= 0:
        pause_before_optimizer(args.pause_optimizer_at, args.pause_s)

    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True,
                                            total_limit=3),
    )
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # shuffle=False: the batches of a step do not depend on RNG state the checkpoint may not hold
    loader = DataLoader(synthetic(args.samples), batch_size=8, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    if args.resume:
        accelerator.load_state()  # the highest-numbered PROJECT_DIR/checkpoints/checkpoint_<i>
        # load_state() does not move the save counter on: without this the next save_state() raises "Checkpoint
        # directory ... already exists. Please manually override `self.save_iteration`" (as its message says)
        folders = os.listdir(os.path.join(args.project_dir, "checkpoints"))
        accelerator.project_configuration.iteration = max(int(re.findall(r"(\d+)$", f)[0]) for f in folders) + 1
        if accelerator.is_main_process:
            print(f"[byo] resumed from step {progress.step}", flush=True)

    steps_per_epoch = len(loader)
    while progress.step < args.max_steps:
        done_in_epoch = progress.step % steps_per_epoch
        epoch_loader = accelerator.skip_first_batches(loader, done_in_epoch) if done_in_epoch else loader
        for x, y in epoch_loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % args.save_every == 0:
                accelerator.save_state()
            if accelerator.is_main_process:
                print(f"[byo] step {progress.step}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if progress.step >= args.max_steps:
                break

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        digest = params_digest(accelerator.unwrap_model(model))
        print(f"[byo] done step {progress.step} params {digest}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
