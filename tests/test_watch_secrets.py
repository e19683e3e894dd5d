"""Secrets stay out of shared state (issue 38.12): a job submitted with a fallback list (`-p local,slurm`), secrets in
its ``--env`` and in its arguments, preempted on its local leg and moved to Slurm (a real two-node cluster), by
``cloudtrain watch`` or by the foreground submit itself. No secret value is in any file of the home or of the
checkpoint store (the team's bucket, where the chain's state is kept for every watcher); the Slurm leg still gets the
real values: from the environment of the watcher that moves it, or from the submitting process's memory. A watcher
without one of them says which, exit 2, and moves nothing."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cloudtrain.checkpoint import lineage
from tests.conftest import cli_env, status_json, wait_for
from tests.slurm_cluster import ONE_CLUSTER, PARTITION, SlurmCluster, slurm, slurm_cluster  # noqa: F401 - fixtures

pytestmark = ONE_CLUSTER  # moves jobs to the Slurm cluster: in turn with test_slurm.py (tests/slurm_cluster.py)

# The job checks every value it was given against its digest (EXPECTED, not secret) and leaves a mark; on its first
# leg it then waits (HOLD) to be preempted.
CHECK = '''\
import hashlib, os, pathlib, sys, time
argv = sys.argv[1:]
got = [os.environ.get("HF_TOKEN", ""), os.environ.get("DB_PASSWORD", ""), os.environ.get("DATABASE_URL", ""),
       argv[argv.index("--password") + 1], argv[argv.index("--cache-url") + 1]]
ok = [hashlib.sha256(v.encode()).hexdigest() for v in got] == os.environ["EXPECTED"].split(",")
where = os.environ.get("SLURM_JOB_ID") and "slurm" or "local"
pathlib.Path(os.environ["MARKS"], f"{where}-{os.getpid()}").write_text("ok" if ok else "wrong values")
if not ok:
    sys.exit(3)
while os.path.exists(os.environ["HOLD"]):
    time.sleep(0.2)
'''


@dataclass
class Secrets:
    token: str = field(default_factory=lambda: "hf_" + secrets.token_hex(17))
    db_password: str = field(default_factory=lambda: "db-" + secrets.token_hex(8))
    # an AWS-style secret key in a URL: `/` and `+` (38.13)
    url_secret: str = field(default_factory=lambda: f"wJalr/{secrets.token_hex(6)}/K7MDENG+bPx")
    arg_password: str = field(default_factory=lambda: "pw-" + secrets.token_hex(8))
    cache_password: str = field(default_factory=lambda: "cache-" + secrets.token_hex(6))

    @property
    def database_url(self) -> str:
        return f"postgres://app:{self.url_secret}@db:5432/x"

    @property
    def cache_url(self) -> str:
        return f"redis://:{self.cache_password}@cache:6379/0"

    def leaks(self, *roots: Path) -> list[tuple[str, str]]:
        """Each (file, value) where a file under ``roots`` holds a secret, as is or JSON-escaped."""
        values = (self.token, self.db_password, self.url_secret, self.arg_password, self.cache_password)
        files = [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
        return [(str(path), value) for path in files for value in values
                if value.encode() in path.read_bytes() or value.replace("/", "\\/").encode() in path.read_bytes()]


class Setup:
    def __init__(self, tmp_path: Path, home: Path) -> None:
        self.home, self.hold = home, tmp_path / "hold"
        self.project, self.marks, self.store, self.shared = (tmp_path / n for n in ("proj", "marks", "store", "shared"))
        for folder in (self.project, self.marks):
            folder.mkdir()
        (self.project / "check.py").write_text(CHECK)
        self.hold.touch()
        self.s = Secrets()

    def submit(self, *mode: str) -> list[str]:
        s = self.s
        expected = ",".join(hashlib.sha256(v.encode()).hexdigest() for v in
                            (s.token, s.db_password, s.database_url, s.arg_password, s.cache_url))
        return [sys.executable, "-m", "cloudtrain", "submit", "check.py", "-p", "local,slurm", "--spot",
                "--max-restarts", "0", "--nodes", "1", "--procs-per-node", "1", "--checkpoint-uri", self.store.as_uri(),
                "--env", f"HF_TOKEN={s.token}", "--env", f"DB_PASSWORD={s.db_password}",
                "--env", f"DATABASE_URL={s.database_url}", "--env", f"EXPECTED={expected}",
                "--env", f"HOLD={self.hold}", "--env", f"MARKS={self.marks}",
                "--set", f"providers.slurm.staging={self.shared}", "--set", f"providers.slurm.python={sys.executable}",
                "--set", f"providers.slurm.partition={PARTITION}", *mode,
                "--", "--password", s.arg_password, "--cache-url", s.cache_url]

    def env(self, **extra: str) -> dict[str, str]:
        """The CLI's environment, without any of the job's variables unless given."""
        env = {k: v for k, v in cli_env(self.home).items() if k not in ("HF_TOKEN", "DB_PASSWORD", "DATABASE_URL")}
        return {**env, **extra}

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=self.project, env=self.env(**extra),
                              capture_output=True, text=True, timeout=240)

    def preempt_local_leg(self, handle: str) -> None:
        wait_for(lambda: any(self.marks.glob("local-*")), timeout=120)
        assert [p.read_text() for p in self.marks.glob("local-*")] == ["ok"]
        preempted = self.cli("preempt", handle)
        assert preempted.returncode == 0, preempted.stderr
        wait_for(lambda: status_json(self.cli, handle)["state"] == "preempted", timeout=60)
        self.hold.unlink()

    def node_logs(self) -> str:
        return "\n".join(f"== {log}\n{log.read_text(errors='replace')[-2000:]}" for log in self.shared.rglob("*.log"))

    def check_moved(self, watched: bool) -> None:
        assert [p.read_text() for p in self.marks.glob("slurm-*")] == ["ok"], self.node_logs()  # the real values
        [kept] = [json.loads(p.read_text()) for p in (self.home / "recovery").glob("*.json")]
        assert [h.split("://")[0] for h in kept["chain"]] == ["local", "slurm"]
        shared_state = lineage.read(lineage.state_uri(self.store.as_uri()))  # kept by watchers only
        assert shared_state == (kept if watched else None)  # the same, to the byte: no value only one of them has
        assert self.s.leaks(self.home, self.store) == []


@pytest.mark.slow
def test_secrets_of_a_moved_job_are_in_no_file_and_the_watcher_takes_them_from_its_environment(
        slurm: SlurmCluster, tmp_path: Path, ct_home: Path) -> None:  # noqa: F811
    run = Setup(tmp_path, ct_home)
    s = run.s
    # the user's shell: the --password value comes from a variable of theirs (`--password $APP_PASSWORD`)
    submitted = subprocess.run(run.submit("--detach"), cwd=run.project, env=run.env(APP_PASSWORD=s.arg_password),
                               capture_output=True, text=True, timeout=180)
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    assert handle.startswith("local://"), submitted.stdout
    needs = "HF_TOKEN, DB_PASSWORD, DATABASE_URL, APP_PASSWORD (args[1]), CLOUDTRAIN_SECRET_ARG_1 (args[3])"
    assert f"needs them in its environment: {needs}" in submitted.stderr
    run.preempt_local_leg(handle)

    # a watcher elsewhere, without one of the job's secrets in its environment: which one, and nothing moved
    keys = {"HF_TOKEN": s.token, "DB_PASSWORD": s.db_password, "DATABASE_URL": s.database_url,
            "APP_PASSWORD": s.arg_password, "CLOUDTRAIN_SECRET_ARG_1": s.cache_url}
    missing = run.cli("watch", handle, "--poll", "0.2", **{k: v for k, v in keys.items() if k != "DB_PASSWORD"})
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "environment lacks DB_PASSWORD" in missing.stderr and "Traceback" not in missing.stderr
    assert not any(run.marks.glob("slurm-*"))

    watched = run.cli("watch", handle, "--poll", "0.2", **keys)
    assert watched.returncode == 0, watched.stdout[-3000:] + watched.stderr[-3000:] + run.node_logs()
    assert "moving it to slurm" in watched.stderr
    run.check_moved(watched=True)


@pytest.mark.slow
def test_a_foreground_submit_moves_its_job_with_the_values_it_was_given(
        slurm: SlurmCluster, tmp_path: Path, ct_home: Path) -> None:  # noqa: F811
    """`submit -p local,slurm` following its job: the move takes the values from the process's memory (its
    environment has none of them: they came as flags), never from a file."""
    run = Setup(tmp_path, ct_home)
    following = subprocess.Popen(run.submit(), cwd=run.project, env=run.env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(run.marks.glob("local-*")), timeout=120)
        listed = run.cli("list", "-o", "json")
        handle = next(line.split('"')[3] for line in listed.stdout.splitlines() if '"handle"' in line)
        run.preempt_local_leg(handle)
        out, err = following.communicate(timeout=240)
    finally:
        following.kill()
    assert following.returncode == 0, out[-2000:] + err[-3000:] + run.node_logs()
    assert "moving it to slurm" in err
    run.check_moved(watched=False)
