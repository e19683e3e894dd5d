"""A real two-node Slurm cluster on this machine, from Debian's packages (``apt-get install slurm-wlm munge``; .ci/run
installs them): munged as the ``munge`` user with its own key and socket, slurmctld, and two slurmd started as
``slurmd -N n1`` / ``slurmd -N n2`` on ports 17001/17002 (per-node pid, spool and log files through ``%n``). Both
nodes are this host, so a job tells them apart by ``SLURMD_NODENAME``; their "shared filesystem" is the local disk.
The daemons start in well under a second and are stopped by their pid files.

In CI (CI=true) a cluster that cannot start fails the run; elsewhere the tests are skipped, saying why, only when the
Slurm or munge programs are not installed.

    python -m tests.slurm_cluster     # start one, print its SLURM_CONF, stop it on Enter
"""

from __future__ import annotations

import contextlib
import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import leaks

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sacct")
NODES = {"n1": 17001, "n2": 17002}  # slurmd ports, as the issue sets them (a free one where taken)
PARTITION = "debug"
# pytest-xdist: one real Slurm cluster (and sshd) per worker that runs a Slurm test, and `scancel --user` after each
# test; the files whose tests use the cluster (or move jobs to it) carry this mark, so they run on one worker in turn
ONE_CLUSTER = pytest.mark.xdist_group("slurm")


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as slurmd binds: a closed one's TIME_WAIT is fine
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _any_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sbin(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if _sbin(p) is None]


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Slurm cluster unavailable in CI: {reason}")
    pytest.skip(reason)


@dataclass
class SlurmCluster:
    root: Path
    conf: Path = field(init=False)
    ctld_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    started: float = 0.0  # seconds the daemons took to come up

    def __post_init__(self) -> None:
        self.conf = self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    @property
    def jobcomp(self) -> Path:
        return self.root / "jobcomp.txt"

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=60, check=check)

    # -- start ----------------------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        began = time.monotonic()
        socket_path = self._start_munge()
        self.ctld_port = _any_port()
        self.ports = {name: port if _free(port) else _any_port() for name, port in NODES.items()}
        for folder in ("state", "spool", "log"):
            (self.root / folder).mkdir()
        self.conf.write_text(self._config(socket_path))
        self._daemon([_sbin("slurmctld") or "slurmctld", "-i"])
        for name in self.ports:
            self._daemon([_sbin("slurmd") or "slurmd", "-N", name])
        self._wait_idle()
        self.started = time.monotonic() - began
        return self

    def _start_munge(self) -> str:
        """munged as the munge user (as root; else as whoever runs the tests), with a key and socket of its own."""
        as_munge = os.geteuid() == 0 and _user("munge") is not None
        keys, sock = self.root / "munge", self.root / "munge-socket"
        keys.mkdir(mode=0o700)
        sock.mkdir(mode=0o755)  # munged wants the socket's folder readable by every client
        (keys / "munge.key").write_bytes(os.urandom(128))
        (keys / "munge.key").chmod(0o400)
        if as_munge:
            user = _user("munge")
            assert user is not None
            for path in (keys, keys / "munge.key", sock):
                os.chown(path, user.pw_uid, user.pw_gid)
        argv = [_sbin("munged") or "munged", f"--key-file={keys / 'munge.key'}", f"--socket={sock / 'munge.sock'}",
                f"--pid-file={keys / 'munged.pid'}", f"--log-file={keys / 'munged.log'}",
                f"--seed-file={keys / 'munged.seed'}"]
        self._daemon(["runuser", "-u", "munge", "--", *argv] if as_munge else argv)
        return str(sock / "munge.sock")

    def _config(self, munge_socket: str) -> str:
        root, user = self.root, getpass.getuser()
        nodes = "\n".join(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=8 "
                          "RealMemory=4000 State=UNKNOWN" for name, port in self.ports.items())
        return f"""\
ClusterName=cloudtrain-test
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MinJobAge=600
{nodes}
PartitionName={PARTITION} Nodes={",".join(self.ports)} Default=YES MaxTime=INFINITE State=UP
"""

    def _daemon(self, argv: list[str]) -> None:
        done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")

    def _wait_idle(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
            states = dict(line.split() for line in shown if line.strip())
            if set(states) == set(self.ports) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the nodes did not come up: {self.log_tail()}")

    # -- stop -----------------------------------------------------------------------------------------
    def pid_files(self) -> list[Path]:
        return [*(self.root / f"slurmd.{n}.pid" for n in self.ports), self.root / "slurmctld.pid",
                self.root / "munge" / "munged.pid"]

    def stop(self) -> None:
        """Each daemon by its pid file: SIGTERM, then SIGKILL for one still there after 10 s (munged last)."""
        for pid_file in self.pid_files():
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().strip())
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.05)
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 20) -> str:
        found = []
        for log in sorted((self.root / "log").glob("*.log")):
            found.append(f"== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie of ours counts as gone
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


@contextlib.contextmanager
def running_cluster() -> Iterator[SlurmCluster]:
    root = Path(tempfile.mkdtemp(prefix=f"ct-slurm-{leaks.SESSION}-"))
    root.chmod(0o755)  # munged (another user) reaches its socket's folder inside
    cluster = SlurmCluster(root)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One real two-node cluster for the session's Slurm tests."""
    missing = missing_programs()
    if missing:
        unavailable(f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge")
    failed: RuntimeError | None = None
    for _ in range(2):  # another test run on this machine can take a fixed slurmd port between the check and the bind
        started = contextlib.ExitStack()
        try:
            cluster = started.enter_context(running_cluster())
        except RuntimeError as exc:
            failed = exc
            continue
        with started:
            yield cluster
        return
    unavailable(f"the Slurm cluster did not start: {failed}")


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The cluster, with its SLURM_CONF in this test's environment (the CLI, sbatch and the jobs inherit it)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    yield slurm_cluster
    slurm_cluster.run("scancel", f"--user={getpass.getuser()}", check=False)  # none outlives its test


if __name__ == "__main__":
    with running_cluster() as running:
        print(f"export SLURM_CONF={running.conf}   # up in {running.started:.2f}s; Enter stops it")
        input()
