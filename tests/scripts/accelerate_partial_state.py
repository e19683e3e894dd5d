"""What Accelerate's own test scripts (test_ops.py, test_sync.py) start with: a PartialState rather than an
Accelerator. PartialState() does not read ACCELERATE_USE_CPU, so on a machine without GPUs each process runs alone
even with it set; ``cpu`` passes PartialState(cpu=True), which joins them."""

import sys

from accelerate import PartialState

state = PartialState(cpu=sys.argv[1:] == ["cpu"])
print(f"distributed_type={state.distributed_type.value} num_processes={state.num_processes}", flush=True)
state.wait_for_everyone()
