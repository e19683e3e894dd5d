"""Checkpoint cost, as ratios against baselines measured in the same run.

    python benchmarks/checkpoint.py [--mb 256]

(a) Training time blocked per checkpoint: async save (Checkpointer, staging only) vs the pure staging copy of the
    same state (target <= 1.5x) and vs a synchronous save + upload of the same state.
(b) Upload throughput of a checkpoint to the S3 emulator (moto on 127.0.0.1): cloudtrain's upload vs boto3's own
    TransferManager (default config) uploading the same files (target >= 0.9x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloudtrain import storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.runtime.checkpointer import Checkpointer


def model_of(mb: int) -> nn.Module:
    width = 2048
    layers = max(1, mb * 1024 * 1024 // (width * width * 4 * 3))  # params + 2 Adam moments, fp32
    return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))


def staging_copy(model: nn.Module, opt: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    _ = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _ = [{k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for s in opt.state.values()]
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=256, help="checkpoint size (params + optimizer state)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    tmp = Path(tempfile.mkdtemp(prefix="ct-bench-"))
    try:
        model = model_of(args.mb)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(torch.randn(4, 2048)).sum().backward()
        opt.step()  # materialise Adam's moments
        size = sum(t.numel() * 4 for t in model.parameters()) * 3 / 1e6
        print(f"state: {size:.0f} MB (params + Adam moments)")

        stage = statistics.median(staging_copy(model, opt) for _ in range(args.repeat))
        ckpt = Checkpointer(model, opt, uri=(tmp / "store").as_uri(), local_dir=tmp / "async")
        for step in range(1, args.repeat + 1):
            ckpt.save(step)
            ckpt.wait()
        blocked = statistics.median(ckpt.blocked_seconds)
        ckpt.close()
        sync = Checkpointer(model, opt, uri=(tmp / "store-sync").as_uri(), local_dir=tmp / "sync", async_save=False)
        sync_times = []
        for step in range(1, args.repeat + 1):
            start = time.perf_counter()
            sync.save(step, block=True)
            sync_times.append(time.perf_counter() - start)
        sync.close()
        synchronous = statistics.median(sync_times)
        print("(a) training blocked per checkpoint")
        print(f"    pure staging copy        {stage:7.3f} s")
        print(f"    async save (blocked)     {blocked:7.3f} s   {blocked / stage:5.2f}x staging  (target <= 1.5x)")
        print(f"    sync save + upload       {synchronous:7.3f} s   {synchronous / blocked:5.2f}x async blocked")

        from tests.emulators import create_bucket, start_s3

        emulator = start_s3(tmp)
        os.environ.update(emulator.env)
        try:
            create_bucket("s3")
            import boto3

            folder = tmp / "async" / checkpoint_store.step_dir(args.repeat)
            names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            files = checkpoint_store.describe_files(folder, names)
            total = sum(f["size"] for f in files) / 1e6
            client = boto3.client("s3")
            ours, theirs = [], []
            for i in range(args.repeat):  # interleaved: both see the same emulator state and machine load
                start = time.perf_counter()
                for f in files:
                    client.upload_file(str(folder / f["path"]), "cloudtrain-test", f"baseline/{i}/{f['path']}")
                theirs.append(time.perf_counter() - start)
                start = time.perf_counter()
                checkpoint_store.upload_files(folder, files, storage.join("s3://cloudtrain-test", f"ours/{i}"))
                ours.append(time.perf_counter() - start)
            t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
            print(f"(b) upload of {total:.0f} MB to S3 (moto on 127.0.0.1)")
            print(f"    boto3 TransferManager    {t_theirs:7.2f} s   {total / t_theirs:7.1f} MB/s")
            print(f"    cloudtrain upload        {t_ours:7.2f} s   {total / t_ours:7.1f} MB/s   "
                  f"{t_theirs / t_ours:5.2f}x throughput  (target >= 0.9x)")
        finally:
            emulator.stop()
        dist.destroy_process_group()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # several checkpoints of the state: GBs


if __name__ == "__main__":
    main()
