"""What masking a node's output costs a chatty job.

    python benchmarks/log_masking.py [--lines 1000000] [--repeat 3]

A worker that prints LINES training-log lines as fast as it can (about 90 bytes each, flushed per line like
PYTHONUNBUFFERED=1 workers are) runs (a) writing straight to a log file, as before, and (b) through the bootstrap's
masked output (cloudtrain/node/log_masking.py) with the secrets a job typically registers: ten values and every
well-known format. Interleaved, best of REPEAT. Reports wall time and the ratio (target: within a few percent), and
the masker's own throughput on the same lines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cloudtrain.node.log_masking import Masker
from cloudtrain.node.secret_values import env_secrets

ENV = {f"SECRET_{i}": f"value-{i:02d}-{'x' * 20}" for i in range(8)} | {
    "DATABASE_URL": "postgres://app:db-password-1@db/x", "HF_TOKEN": "hf_" + "a1" * 17}
WORKER = ("import sys\n"
          "for i in range(int(sys.argv[1])):\n"
          "    print(f'[default0]:step {i} loss {1 / (i + 1):.6f} lr 0.000100 grad_norm 1.2345 tokens/s 12345.6 "
          "elapsed 12.3s', flush=True)\n")
HARNESS = ("import subprocess, sys\n"
           "from cloudtrain.node.log_masking import Masker, MaskedOutput\n"
           "from benchmarks.log_masking import ENV\n"
           "with MaskedOutput(Masker.from_env(ENV)):\n"
           "    subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]], check=True)\n")


def run(lines: int, masked: bool, out: Path) -> float:
    cmd = [sys.executable, "-c", HARNESS, WORKER, str(lines)] if masked else [sys.executable, "-c", WORKER, str(lines)]
    start = time.perf_counter()
    with open(out, "wb") as log:
        subprocess.run(cmd, stdout=log, check=True, cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "node.log"
        plain, masked = [], []
        for _ in range(args.repeat):
            plain.append(run(args.lines, False, out))
            masked.append(run(args.lines, True, out))
        size = out.stat().st_size
        data = out.read_bytes()
    masker = Masker(env_secrets(ENV))
    start = time.perf_counter()
    for offset in range(0, len(data), 1 << 16):
        masker(data[offset:offset + (1 << 16)])
    masker_s = time.perf_counter() - start
    best_plain, best_masked = min(plain), min(masked)
    print(f"worker printing {args.lines:,} lines ({size / 1e6:.0f} MB), best of {args.repeat}:")
    print(f"straight to the log  {best_plain:6.2f} s  ({args.lines / best_plain:,.0f} lines/s)")
    print(f"through the masker   {best_masked:6.2f} s  ({args.lines / best_masked:,.0f} lines/s)")
    print(f"ratio                {best_masked / best_plain:6.2f}x")
    print(f"masker alone         {size / 1e6 / masker_s:6.0f} MB/s on the same lines")


if __name__ == "__main__":
    main()
