"""A real OpenSSH server on 127.0.0.1, as the login host of the test Slurm cluster (tests/slurm_cluster.py): its own
host key, one authorized key, and the cluster's SLURM_CONF in every session (``SetEnv``), as a login node has its
/etc/slurm. The client side is an OpenSSH config naming it ``slurm-login``, given to cloudtrain as its ssh command
(CLOUDTRAIN_SLURM_SSH="ssh -F <config>"). In CI a server that cannot start fails the run; elsewhere the test is
skipped, saying why, when OpenSSH's server is not installed (apt-get install openssh-server)."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster, unavailable

ALIAS = "slurm-login"


@dataclass(frozen=True)
class Sshd:
    root: Path
    port: int

    @property
    def client_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def ssh(self) -> str:
        """The ssh command cloudtrain is given."""
        return f"ssh -F {self.client_config}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def sshd(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/sbin")
    if server is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        unavailable("OpenSSH is not installed (no sshd, ssh or ssh-keygen): apt-get install openssh-server")
    assert server is not None
    root = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    running = Sshd(root, _free_port())
    (root / "sshd_config").write_text(f"""\
Port {running.port}
ListenAddress 127.0.0.1
HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
SetEnv SLURM_CONF={slurm_cluster.conf}
LogLevel ERROR
""")
    running.client_config.write_text(f"""\
Host {ALIAS}
  HostName 127.0.0.1
  Port {running.port}
  User {getpass.getuser()}
  IdentityFile {root}/user_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
""")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder, as its package has it
    started = subprocess.run([server, "-f", str(root / "sshd_config"), "-E", str(root / "sshd.log")],
                             capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        unavailable(f"sshd did not start: {started.stderr.strip()}")
    deadline = time.monotonic() + 20
    while subprocess.run(["ssh", "-F", str(running.client_config), "-o", "BatchMode=yes", ALIAS, "true"],
                         capture_output=True, timeout=30).returncode != 0:
        if time.monotonic() > deadline:
            unavailable(f"sshd does not answer: {(root / 'sshd.log').read_text()[-500:]}")
        time.sleep(0.1)
    yield running
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((root / "sshd.pid").read_text().strip()), signal.SIGTERM)
