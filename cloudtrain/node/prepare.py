"""What a node prepares before torchrun starts, once the bootstrap has unpacked the bundle: the job's requirements,
installed into a job-private folder, and the script's arguments with cloudtrain's node variables filled in.
Standard library only, Python 3.8 (the node entry, cloudtrain/node/entry.py, runs it from the bundle's lib/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cloudtrain import contract
from cloudtrain.node.secret_values import PLACEHOLDER

_ARG_VARIABLE = re.compile(contract.ARG_VARIABLE)


def _log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def install_requirements(src: Path, site: Path, file: str | None, specs: list[str],
                         env: dict[str, str]) -> str | None:
    """Install into a job-private folder, never into the image's (or the user's) environment. A requirement the plan
    sent as a placeholder (it holds a secret: ``pkg @ https://user:TOKEN@host/...``) gets its value from the node's
    environment, and every listed requirement reaches pip in a file only this user reads, never on its command
    line. Returns why the node cannot start (pip failed), or None."""
    if not file and not specs:
        return None
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(site)]
    cmd += ["-r", str(src / file)] if file else []
    if specs:
        listed = site.parent / "requirements.cloudtrain.txt"
        fd = os.open(str(listed), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("".join(PLACEHOLDER.sub(lambda m: env.get(m.group(1), m.group(0)), spec) + "\n"
                              for spec in specs))
        cmd += ["-r", str(listed)]
    _log(f"installing requirements: {' '.join(cmd[4:])}" + (f" ({', '.join(specs)})" if specs else ""))
    result = subprocess.run(cmd, cwd=src)
    return f"pip install failed with exit code {result.returncode}" if result.returncode != 0 else None


def expand_args(args: list[str], env: dict[str, str]) -> list[str]:
    """cloudtrain's node variables named in the script's arguments (``--out_dir=${CLOUDTRAIN_CHECKPOINT_DIR}``),
    replaced by their values on this node, without a shell; ``$${NAME}`` is the text ``${NAME}``. The plan refused
    any name that is not cloudtrain's (contract.ARG_VARIABLES)."""
    def value(match: re.Match[str]) -> str:
        name = match.group(2)
        return "${" + name + "}" if match.group(1) else env.get(name, match.group(0))

    return [_ARG_VARIABLE.sub(value, arg) for arg in args]
