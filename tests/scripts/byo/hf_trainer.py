"""A plain Hugging Face ``transformers.Trainer`` script: a tiny GPT-2 built from config, synthetic tokens.

Nothing cloudtrain-specific. Under torchrun the Trainer reads RANK/LOCAL_RANK/WORLD_SIZE and wraps the model in DDP
(gloo on CPU). It writes ``OUTPUT_DIR/checkpoint-<global_step>/`` every ``--save_steps`` steps (rank 0 writes the
model, optimizer, scheduler and ``trainer_state.json``; every rank writes its own ``rng_state_<rank>.pth``).
``--resume_from_checkpoint`` (no value, or ``true``) resumes from the newest ``checkpoint-<N>`` and raises when there
is none; a path resumes from that folder.

    torchrun --nproc-per-node 2 hf_trainer.py --output_dir OUT --max_steps 12 --save_steps 4
    torchrun --nproc-per-node 2 hf_trainer.py --output_dir OUT --max_steps 12 --save_steps 4 --resume_from_checkpoint
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

SEQ = 16
VOCAB = 64


class SyntheticTokens(Dataset):
    """Fixed random token sequences (the same on every rank and every run); labels are the inputs (causal LM)."""

    def __init__(self, samples: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, VOCAB, (samples, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class ByoLines(TrainerCallback):
    """Prints the lines the tests parse (global rank 0 only) and sleeps after each optimizer step."""

    def __init__(self, step_sleep: float, resuming: bool) -> None:
        self.step_sleep = step_sleep
        self.resuming = resuming

    def on_train_begin(self, args, state, control, **kwargs):  # state is already restored from the checkpoint here
        if self.resuming and state.is_world_process_zero:
            print(f"[byo] resumed from step {state.global_step}", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        # at a save step the Trainer saves checkpoint-<N> after on_step_end: print (and sleep) in on_save then, so that
        # "[byo] step N" always comes after rank 0 finished writing checkpoint-N
        if not control.should_save:
            self._step_done(state)

    def on_save(self, args, state, control, **kwargs):
        self._step_done(state)

    def _step_done(self, state) -> None:
        if state.is_world_process_zero:
            print(f"[byo] step {state.global_step}", flush=True)
        if self.step_sleep:
            time.sleep(self.step_sleep)


def slow_rng_state(rank: int, step: int, seconds: float) -> None:
    """One rank late with its own file of a save: the Trainer's ``_save_rng_state`` wrapped (not modified) to sleep
    first on ``rank`` at global step ``step``, while rank 0 writes trainer_state.json and trains on."""
    write = Trainer._save_rng_state

    def late(self, output_dir):
        if self.args.process_index == rank and self.state.global_step == step:
            time.sleep(seconds)
        return write(self, output_dir)

    Trainer._save_rng_state = late


def resume_arg(value: str | None) -> str | bool | None:
    if value is None or value.lower() == "false":
        return None
    if value.lower() == "true":
        return True
    return value


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--save_steps", type=int, default=4)
    p.add_argument("--resume_from_checkpoint", nargs="?", const="true", default=None)
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--slow_rng_rank", type=int, default=-1,
                   help="this rank sleeps --slow_rng_s before writing its rng_state_<rank>.pth at step --slow_rng_at")
    p.add_argument("--slow_rng_s", type=float, default=0.0)
    p.add_argument("--slow_rng_at", type=int, default=-1)
    args = p.parse_args()
    resume = resume_arg(args.resume_from_checkpoint)
    if args.slow_rng_rank >= 0:
        slow_rng_state(args.slow_rng_rank, args.slow_rng_at, args.slow_rng_s)

    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ))
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        ddp_find_unused_parameters=False,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=SyntheticTokens(args.samples),
        callbacks=[ByoLines(args.step_sleep, resume is not None)],
    )
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        print(f"[byo] done step {trainer.state.global_step} params {params_digest(model)}", flush=True)


if __name__ == "__main__":
    main()
