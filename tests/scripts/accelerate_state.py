"""What Accelerate's own test scripts start with: an Accelerator from the environment, a barrier, a report. On a
machine without GPUs and without ACCELERATE_USE_CPU it falls back to one process per rank (DistributedType.NO)."""

from accelerate import Accelerator

accelerator = Accelerator()
accelerator.wait_for_everyone()
print(f"distributed_type={accelerator.distributed_type.value} num_processes={accelerator.num_processes}", flush=True)
