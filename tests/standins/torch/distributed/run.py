"""``python -m torch.distributed.run`` for the stand-in (see ../__init__.py): starts --nproc-per-node workers of
the script with the variables torchrun gives them, waits, and exits with the first non-zero code. With --redirects 3
and --log-dir, each worker's stdout and stderr go to files laid out as torchrun lays them out
(``<log dir>/<run id>_<random>/attempt_0/<local rank>/std{out,err}.log``)."""

import contextlib
import os
import subprocess
import sys
import tempfile

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
    run_dir = None
    if options.get("--redirects") == "3" and "--log-dir" in options:
        os.makedirs(options["--log-dir"], exist_ok=True)
        run_dir = tempfile.mkdtemp(prefix=options.get("--rdzv-id", "none") + "_", dir=options["--log-dir"])
    procs = []
    for local in range(nproc):
        env = dict(os.environ, LOCAL_RANK=str(local), RANK=str(node_rank * nproc + local),
                   WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc))
        with contextlib.ExitStack() as files:  # closed once the worker holds its own copies
            streams = {}
            if run_dir:
                folder = os.path.join(run_dir, "attempt_0", str(local))
                os.makedirs(folder)
                streams = {name: files.enter_context(open(os.path.join(folder, name + ".log"), "wb"))
                           for name in ("stdout", "stderr")}
            procs.append(subprocess.Popen([sys.executable, *target], env=env, **streams))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
