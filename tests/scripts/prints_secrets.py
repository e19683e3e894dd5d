"""A careless script: prints the secrets it was given (env and arguments), then reports, without printing them
again, whether it got the real values and whether any command line of its process tree shows them (`ps`)."""

import argparse
import hashlib
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--hf-token", required=True)
parser.add_argument("--password", required=True)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
values = {"env": os.environ["WANDB_API_KEY"], "url": os.environ["DATABASE_URL"], "hf": args.hf_token,
          "password": args.password}
print(f"env token {values['env']} database {values['url']}", flush=True)
print(f"arg token {values['hf']}", file=sys.stderr, flush=True)
print(f"password {values['password']} (partial line: ", end="", flush=True)
print("done)", flush=True)
for name, value in sorted(values.items()):
    print(f"digest {name} {hashlib.sha256(value.encode()).hexdigest()}", flush=True)
print(f"epochs {args.epochs}", flush=True)

shown = []  # the command lines of this worker, torchrun and the bootstrap
pid = os.getpid()
for _ in range(3):
    shown.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
clean = not any(v in line for v in (values["hf"], values["password"]) for line in shown)
print(f"command lines clean: {clean} ({len(shown)} checked)", flush=True)
