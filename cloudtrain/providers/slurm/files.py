"""The job's folder and the staged bundle on the cluster's shared filesystem: read and written here, or over SSH on
the login host (``providers.slurm.login``), where that filesystem is."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from cloudtrain import safe_json
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME, Package
from cloudtrain.bundle.staging import stage_bundle
from cloudtrain.providers.slurm.clients import Commands


class SharedFiles:
    def __init__(self, commands: Commands) -> None:
        self.commands = commands
        self.remote = bool(commands.login)

    def _sh(self, script: str, data: bytes | None = None, check: bool = True) -> Any:
        return self.commands.run(["sh", "-c", script], check=check, data=data, binary=True)

    def writable(self, folder: str) -> str | None:
        """Creates ``folder``; None when it can be written, else why not."""
        if not self.remote:
            try:
                Path(folder).mkdir(parents=True, exist_ok=True)
                probe = Path(folder) / f".cloudtrain-probe-{os.getpid()}"
                probe.touch()
                probe.unlink()
            except OSError as exc:
                return exc.strerror or str(exc)
            return None
        quoted = shlex.quote(folder)
        done = self._sh(f"mkdir -p {quoted} && test -w {quoted}", check=False)
        return None if done.returncode == 0 else (done.stderr.decode(errors="replace").strip() or "not writable")

    def write(self, path: str, data: bytes, private: bool = False) -> None:
        """A whole file, replaced atomically (``private``: readable by its owner only, from its creation)."""
        if not self.remote:
            target, tmp = Path(path), Path(f"{path}.tmp")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
            return
        quoted, part = shlex.quote(path), shlex.quote(f"{path}.tmp")
        umask = "umask 077; " if private else ""
        self._sh(f"{umask}mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {part} && mv -f {part} {quoted}",
                 data)

    def read(self, path: str, offset: int = 0) -> bytes | None:
        """What the file holds from ``offset`` on; None when it does not exist."""
        if not self.remote:
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    return f.read()
            except FileNotFoundError:
                return None
        q = shlex.quote(path)
        done = self._sh(f"test -f {q} || exit 3; tail -c +{offset + 1} {q}", check=False)
        return None if done.returncode == 3 else bytes(done.stdout)

    def read_json(self, path: str) -> dict[str, Any]:
        try:  # here, safe_json.load: a FIFO in the file's place is refused, not waited on (`test -f` refuses it there)
            found = safe_json.load(path) if not self.remote else safe_json.loads(self.read(path) or b"{}", path)
        except (FileNotFoundError, ValueError):  # none yet; or safe_json.UnreadableJson: cut short, garbled ...
            return {}
        return found if isinstance(found, dict) else {}

    def logs(self, folder: str) -> list[str]:
        """The node logs in a job's folder (node-<N>.log), in order of N."""
        if not self.remote:
            names = [p.name for p in Path(folder).glob("node-*.log")]
        else:
            done = self._sh(f"cd {shlex.quote(folder)} 2>/dev/null && ls -1", check=False)
            names = [n for n in done.stdout.decode(errors="replace").split() if n.startswith("node-")]
        ranks = sorted(int(n[5:-4]) for n in names if n.endswith(".log") and n[5:-4].isdigit())
        return [f"{folder}/node-{rank}.log" for rank in ranks]

    def stage(self, package: Package, prefix_uri: str, folder: str) -> None:
        """The bootstrap and bundle under a digest-named folder, the manifest last (it marks the folder whole);
        nothing when that digest is staged already."""
        if not self.remote:
            stage_bundle(package, prefix_uri)
            return
        manifest = f"{folder}/manifest.json"
        if self._sh(f"test -f {shlex.quote(manifest)}", check=False).returncode == 0:
            return
        self.write(f"{folder}/{BOOTSTRAP_NAME}", package.bootstrap.read_bytes())
        self.write(f"{folder}/{BUNDLE_NAME}", package.path.read_bytes())
        self.write(manifest, json.dumps(package.manifest(), indent=1).encode())
