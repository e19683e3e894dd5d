"""The README demo: a real local job on gloo processes, checkpointing to a local store, preempted once, restarted
and resumed from its checkpoint, through the Python SDK.

    python examples/preemption_demo.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from cloudtrain import Job

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    store = Path(tempfile.mkdtemp(prefix="cloudtrain-demo-"))
    job = Job(
        name="demo", source_dir=str(REPO / "entrypoints"), script="train_ddp.py",
        nodes=2, procs_per_node=2, max_restarts=1,  # managed spot, emulated: one restart after preemption
        checkpoint={"uri": (store / "checkpoints").as_uri()}, output_uri=(store / "output").as_uri(),
        args=["--epochs", "3", "--checkpoint-every", "10", "--step-sleep", "0.05"],
    )
    print(job, end="\n\n")  # the job's settings (`cloudtrain plan` shows the whole plan)
    run = job.submit("local")  # each submit names its job anew: the handle is what status, logs and cancel take
    print(f"submitted {run.handle}; following its logs until the first checkpoint ...")
    preempted = False
    for line in run.logs(follow=True):  # follows across the restart until the job ends
        print(line)
        if not preempted and "checkpoint step 20 published" in line:
            print(f">>> simulating a spot interruption of {run.handle} (SIGTERM to every node) <<<")
            run.preempt()  # the same as `cloudtrain preempt <handle>`
            preempted = True
    status = run.wait(progress=False)
    print()
    print(run)  # what `cloudtrain status <handle>` prints
    print(f"\n{run.handle}: {status.state.value} after {status.restarts} restart(s); checkpoints in "
          f"{store / 'checkpoints'}, final model in {store / 'output' / 'model.pt'}")
    if status.state.value != "succeeded" or not preempted:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
