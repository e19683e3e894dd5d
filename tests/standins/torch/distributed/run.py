"""``python -m torch.distributed.run`` for the stand-in (see ../__init__.py): starts --nproc-per-node workers of
the script with the variables torchrun gives them, waits, and exits with the first non-zero code."""

import os
import subprocess
import sys

FLAGS = {"--standalone", "--module", "--no-python"}  # options without a value; every other --option takes one


def main(argv):
    options, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        if argv[i] in FLAGS:
            options[argv[i]], i = "", i + 1
        else:
            options[argv[i]], i = argv[i + 1], i + 2
    target = argv[i:]
    if "--module" in options:
        target = ["-m", *target]
    nproc, nnodes = int(options["--nproc-per-node"]), int(options.get("--nnodes", "1"))
    node_rank = int(options.get("--node-rank", "0"))
    procs = []
    for local in range(nproc):
        env = dict(os.environ, LOCAL_RANK=str(local), RANK=str(node_rank * nproc + local),
                   WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc))
        procs.append(subprocess.Popen([sys.executable, *target], env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
