"""What a script nobody wrote for cloudtrain may leave behind: a checkpoint cut short in its checkpoint folder (a
save that never finished) and the PyTorch DDP tutorial's snapshot.pt in its working folder. Says what its checkpoint
folder held when it started, then waits to be stopped."""

import io
import os
import time
from pathlib import Path

import torch

folder = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
print(f"checkpoint folder holds {sorted(os.listdir(folder)) if folder.is_dir() else []}", flush=True)
folder.mkdir(parents=True, exist_ok=True)
buffer = io.BytesIO()
torch.save({"weights": torch.zeros(4096)}, buffer)
(folder / "ckpt.pt").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])  # a save that never finished
torch.save({"epoch": 3}, "snapshot.pt")  # the DDP tutorial's checkpoint, in the working folder
print("ready", flush=True)
time.sleep(120)
