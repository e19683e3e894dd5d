"""The pattern of pytorch/examples distributed/ddp/example.py: counts GPUs first and, finding too few, says so and
exits 0 without joining a process group or training anything."""

import torch

NEEDED = 2

if __name__ == "__main__":
    if torch.cuda.device_count() < NEEDED:
        print(f"Unable to locate sufficient {NEEDED} gpus to run this example. Exiting.", flush=True)
        raise SystemExit(0)
    print("would train here", flush=True)
