"""The Slurm provider on a real two-node Slurm cluster (tests/slurm_cluster.py): the reference DDP and FSDP trainers
submitted through the CLI, a job requeued mid-run that resumes bitwise, a job that takes its final checkpoint at its
time limit, the conformance suite; and offline, the plan (the batch script) and the host-list expansion against
``scontrol show hostnames``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.job_types import JobState
from cloudtrain.providers.slurm import clients
from cloudtrain.providers.slurm.node import detect, expand_hostlist
from cloudtrain.providers.slurm.status import STATES, job_state
from cloudtrain.sdk import Job, plan_job
from cloudtrain.show.formatting import plan_text
from cloudtrain.testing import Harness, ProviderConformance
from tests.conftest import REPO, cli_env, ddp_project, wait_for
from tests.slurm_cluster import ONE_CLUSTER, PARTITION, SlurmCluster, slurm, slurm_cluster  # noqa: F401 - fixtures
from tests.sshd import ALIAS, Sshd, sshd  # noqa: F401 - a fixture

pytestmark = ONE_CLUSTER  # one cluster per worker, one Slurm test at a time (tests/slurm_cluster.py)

ARGS = ["--", "--epochs", "2", "--checkpoint-every", "8"]
TRAINERS = {"ddp": "train_ddp.py", "fsdp": "train_fsdp.py"}


class Cli:
    """The CLI as a user on the cluster's login node runs it (SLURM_CONF in the environment), in one project."""

    def __init__(self, home: Path, project: Path, staging: Path) -> None:
        self.home, self.project, self.staging = home, project, staging

    def __call__(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        try:  # under pytest's 300 s, so that a job that never ends says why here rather than as a bare timeout
            done = subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=self.project,
                                  env=cli_env(self.home), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"cloudtrain {' '.join(args[:2])} ran over {timeout:.0f}s\n"
                                 f"{self.stuck(exc)}") from None
        if check:
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    def stuck(self, exc: subprocess.TimeoutExpired) -> str:
        """What a run that did not end leaves to read: its own output, the queue, and the node logs."""
        def text(data: str | bytes | None) -> str:
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
        queue = subprocess.run(["squeue", "-o", "%i %T %R %M"], capture_output=True, text=True, timeout=30)
        nodes = subprocess.run(["sinfo", "-N", "-o", "%N %T %E"], capture_output=True, text=True, timeout=30)
        logs = [f"== {log}\n{log.read_text(errors='replace')[-2000:]}" for log in
                sorted(self.staging.glob("jobs/*/node-*.log"))]
        return "\n".join([text(exc.stdout)[-3000:], text(exc.stderr)[-3000:], "== squeue", queue.stdout + queue.stderr,
                          "== sinfo", nodes.stdout + nodes.stderr, *logs])

    def submit(self, trainer: str, *args: str, procs: int = 2) -> list[str]:
        return ["submit", TRAINERS[trainer], "--provider", "slurm", "--nodes", "2", "--procs-per-node", str(procs),
                "--set", f"providers.slurm.staging={self.staging}", "--set", f"providers.slurm.python={sys.executable}",
                "--set", f"providers.slurm.partition={PARTITION}", *args]

    def status(self, handle: str) -> dict[str, Any]:
        return dict(json.loads(self("status", handle, "-o", "json").stdout))

    def logs(self, handle: str) -> str:
        return self("logs", handle).stdout


def trainer_project(tmp: Path) -> Path:
    proj = tmp / "proj"
    proj.mkdir(exist_ok=True)
    for name in TRAINERS.values():
        (proj / name).write_text((REPO / "entrypoints" / name).read_text())
    return proj


def final_weights(output_uri: str) -> dict[str, torch.Tensor]:
    return dict(torch.load(Path(output_uri.removeprefix("file://")) / "model.pt", weights_only=True))


@pytest.fixture
def cli(slurm: SlurmCluster, tmp_path: Path) -> Cli:  # noqa: F811
    return Cli(tmp_path / "home", trainer_project(tmp_path), tmp_path / "shared")


@pytest.fixture(scope="module")
def ddp_run(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, str, str]:  # noqa: F811
    """The 2-node x 2-process DDP job, run once through the CLI (submit follows it to the end): (cli, handle,
    output URI). Its final weights are what the requeued run must end with."""
    tmp = tmp_path_factory.mktemp("slurm-ddp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        run = Cli(tmp / "home", trainer_project(tmp), tmp / "shared")
        out = (tmp / "out").as_uri()
        done = run(*run.submit("ddp", "--checkpoint-uri", (tmp / "ckpt").as_uri(), "--output-uri", out, *ARGS))
    handle = next(word for word in (done.stdout + done.stderr).split() if word.startswith("slurm://"))
    return run, handle, out


# -- on the cluster ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_ddp_job_runs_on_two_nodes_and_its_outputs_come_back(ddp_run: tuple[Cli, str, str], slurm: SlurmCluster,  # noqa: F811
                                                             tmp_path: Path) -> None:
    run, handle, out = ddp_run
    status = run.status(handle)
    assert status["state"] == "succeeded" and status["node_list"] == "n[1-2]", status
    logs = run.logs(handle)
    for rank in (0, 1):  # one srun task per node, each on its own slurmd, each node's bootstrap under Slurm's contract
        assert f"[node-{rank}] [cloudtrain] node {rank}/2 on slurm: 2 processes" in logs, logs[-3000:]
    assert "done: world_size=4 steps=32" in logs  # 2048 samples / (4 ranks x 32) x 2 epochs
    fetched = run("outputs", handle, "--download", str(tmp_path / "got"))
    assert "model.pt" in fetched.stdout and (tmp_path / "got" / "model.pt").is_file()
    assert torch.load(tmp_path / "got" / "model.pt", weights_only=True).keys() == final_weights(out).keys()
    listed = json.loads(run("list", "--provider", "slurm", "-o", "json").stdout)
    assert [s["state"] for s in listed if s["handle"] == handle] == ["succeeded"]
    # issue 41.1 on Slurm: the client's events, Slurm's states and both nodes' events (from their logs on the shared
    # filesystem: node_started, the trainer's steps and checkpoints) in time order; progress and goodput from them
    events = status["timeline"]["events"]
    kinds = [e["e"] for e in events]
    for kind in ("submitted", "staged", "node_started", "step", "checkpoint", "ended"):
        assert kind in kinds, (kind, kinds)
    assert sorted(e["rank"] for e in events if e["e"] == "node_started") == [0, 1]
    assert [e["t"] for e in events] == sorted(e["t"] for e in events) and status["timeline"]["missing"] == 0
    assert status["progress"]["step"] == 32 and status["goodput"]["ratio"] is not None


@pytest.mark.slow
def test_an_fsdp_job_runs_on_two_nodes(cli: Cli) -> None:
    out = (cli.project.parent / "out").as_uri()
    done = cli(*cli.submit("fsdp", "--strategy", "fsdp", "--output-uri", out, "--", "--epochs", "1"))
    assert "done:" in done.stdout and "world_size=4" in done.stdout, done.stdout[-3000:]
    assert (Path(out.removeprefix("file://")) / "model.pt").is_file()


@pytest.mark.slow
def test_a_requeued_job_resumes_from_its_checkpoint_bitwise(cli: Cli, slurm: SlurmCluster,  # noqa: F811
                                                            ddp_run: tuple[Cli, str, str]) -> None:
    """``scontrol requeue`` mid-run: Slurm SIGTERMs every node (final checkpoint) and queues the job again; started
    at once, the second run (SLURM_RESTART_COUNT=1) resumes, and the weights equal the uninterrupted run's, bitwise,
    in a world of 4 (2 nodes x 2 processes: cloudtrain.runtime fixes DDP's bucket layout from the first step)."""
    root = cli.project.parent
    expected = final_weights(ddp_run[2])  # the same job (trainer, layout, ARGS) run straight through
    out = (root / "out").as_uri()
    handle = cli(*cli.submit("ddp", "--checkpoint-uri", (root / "ckpt").as_uri(), "--output-uri", out,
                             "--max-restarts", "1", "--detach", *ARGS, "--step-sleep", "0.25")).stdout.strip()
    node_log = cli.staging / "jobs" / handle.removeprefix("slurm://") / "node-0.log"
    wait_for(lambda: node_log.is_file() and "checkpoint step 8 published" in node_log.read_text(), timeout=180)
    slurm_id = cli.status(handle)["slurm_job_id"]
    slurm.run("scontrol", "requeue", slurm_id)

    def started_again() -> bool:  # a requeued job waits before it is eligible again: make it start now
        shown = clients.Commands().show_job(slurm_id) or {}
        if shown.get("JobState") == "PENDING":
            slurm.run("scontrol", "update", f"JobId={slurm_id}", "StartTime=now", check=False)
        return shown.get("JobState") == "RUNNING" and shown.get("Restarts") == "1"

    wait_for(started_again, timeout=120, interval=0.5)
    assert cli("wait", handle, "--timeout", "240", check=False).returncode == 0, cli.logs(handle)[-3000:]
    logs = cli.logs(handle)
    final = re.search(r"stop requested: final checkpoint at step (\d+)", logs)
    assert final and "[batch] [cloudtrain] slurm job" in logs and "run 2" in logs, logs[-4000:]
    assert f"INFO resumed from step {final.group(1)}" in logs, logs[-4000:]  # the second run, from the final save
    status = cli.status(handle)
    assert status["state"] == "succeeded" and status["restarts"] == 1, status
    got = final_weights(out)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


@pytest.mark.slow
def test_a_node_that_fails_before_the_rendezvous_stops_the_job(cli: Cli, slurm: SlurmCluster) -> None:  # noqa: F811
    """Node 0 cannot listen on the rendezvous port (taken here, as another job's could be), so it fails at once
    while node 1 waits for the rendezvous: srun stops node 1 too (--kill-on-bad-exit), and the job ends failed with
    node 0's error, instead of running until torchrun's rendezvous timeout. Node 1 says it was stopped because node
    0 failed (it said "preempted": srun's SIGTERM looked like Slurm's own)."""
    import socket

    from cloudtrain.providers.slurm.node import rendezvous_port

    probe = slurm.run("sbatch", "--parsable", "--hold", "--wrap", "true").stdout.strip().split(";")[0]
    slurm.run("scancel", probe)
    with socket.socket() as taken:  # listening, never answering: node 1's connection waits as on a dead peer
        taken.bind(("127.0.0.1", rendezvous_port(str(int(probe) + 1), 0)))
        taken.listen(8)
        done = cli(*cli.submit("ddp", "--", "--epochs", "1"), check=False, timeout=200)
    text = done.stdout + done.stderr
    assert done.returncode != 0 and "failed" in text and "EADDRINUSE" in text, text[-3000:]
    handle = next(word for word in text.split() if word.startswith("slurm://"))
    assert cli.status(handle)["state"] == "failed"
    assert "node 0 failed (torchrun exit 1)" in text and "port" in text, text[-3000:]
    assert "node 1 stopped: node 0 failed (torchrun exit" in text, text[-3000:]


@pytest.mark.slow
@pytest.mark.soak  # Slurm's time limits are whole minutes: ~2 min of waiting for the limit (nox -s soak, which CI runs)
def test_a_job_at_its_time_limit_takes_a_final_checkpoint(cli: Cli, slurm: SlurmCluster) -> None:  # noqa: F811
    """max_runtime 2 minutes, grace 5 s: the nodes get SIGTERM 5 to 65 s before the limit (Slurm sends it up to a
    minute early: with 1 minute it could come before training starts), save a final checkpoint, and the job ends
    failed, saying so."""
    ckpt = (cli.project.parent / "ckpt").as_uri()
    handle = cli(*cli.submit("ddp", "--checkpoint-uri", ckpt, "--max-runtime", "2m", "--set",
                             "providers.slurm.grace_period=5", "--detach", "--", "--epochs", "200",
                             "--checkpoint-every", "1000", "--step-sleep", "0.05")).stdout.strip()
    assert cli("wait", handle, "--timeout", "240", check=False).returncode != 0
    logs = cli.logs(handle)
    assert "stop requested: final checkpoint at step" in logs, logs[-4000:]
    saved = [c.step for c in checkpoint_store.list_complete(ckpt)]
    assert saved and f"final checkpoint at step {saved[-1]}" in logs, (saved, logs[-3000:])
    status = cli.status(handle)
    assert status["state"] == "failed" and status["slurm_state"] in ("FAILED", "TIMEOUT"), status
    assert "checkpoint" in status["message"] and "submit again" in status["message"], status


def test_status_reads_slurms_records_once_slurmctld_forgets_the_job(ddp_run: tuple[Cli, str, str],
                                                                    slurm: SlurmCluster,  # noqa: F811
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without accounting, ``sacct -c`` reads the jobcomp file: the same state, folder and outputs."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.providers.slurm.provider import SlurmProvider

    handle = JobHandle.parse(ddp_run[1])
    live = SlurmProvider().describe(handle)
    monkeypatch.setattr(clients.Commands, "ids_named", lambda self, name: [])  # as after MinJobAge
    recorded = SlurmProvider().describe(handle)
    assert recorded.details["source"] == "sacct" and live.details["source"] == "scontrol"
    assert recorded.state is live.state is JobState.SUCCEEDED
    for key in ("slurm_job_id", "job_dir", "exit_code"):
        assert recorded.details[key] == live.details[key], key
    assert recorded.output_uri == live.output_uri and recorded.output_uri
    assert str(handle.job_id) in slurm.jobcomp.read_text()


def test_host_lists_expand_as_scontrol_show_hostnames(slurm: SlurmCluster) -> None:  # noqa: F811
    for listed in ["n[1-2]", "gpu[01-03,7],login", "a[8-11]", "x[098-101]", "r[1-2]n[1-2]", "solo", "n[1,1]",
                   "n[1-2],n[2-3]", "rack-[1-2]-node[01-02]"]:
        oracle = slurm.run("scontrol", "show", "hostnames", listed).stdout.split()
        assert expand_hostlist(listed) == oracle, listed
    for invalid in ["a-[1-3]-b", "n[3-1]"]:  # Slurm refuses these too
        assert slurm.run("scontrol", "show", "hostnames", invalid, check=False).stdout.split() == []
    for invalid in ["a-[1-3]-b", "n[3-1]", "n[1-2"]:  # (Slurm reads the last as 'n]')
        with pytest.raises(ValueError, match="host list"):
            expand_hostlist(invalid)


def test_doctor_checks_the_cluster(cli: Cli, slurm: SlurmCluster, tmp_path: Path,  # noqa: F811
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def checks(**env: str) -> dict[str, tuple[str, str]]:
        found = json.loads(subprocess.run([sys.executable, "-m", "cloudtrain", "doctor", "-p", "slurm", "-o", "json"],
                                          env={**cli_env(cli.home), **env}, capture_output=True, text=True,
                                          cwd=tmp_path, timeout=120).stdout)
        return {c["name"]: (c["status"], c["detail"]) for c in found if c["area"] == "slurm"}

    good = checks(CLOUDTRAIN_SLURM_PARTITION=PARTITION, CLOUDTRAIN_SLURM_STAGING=str(tmp_path / "shared"))
    assert {name: status for name, (status, _) in good.items()} == {"commands": "ok", "partition": "ok",
                                                                     "staging": "ok"}, good
    assert "slurm-wlm" in good["commands"][1] or "slurm" in good["commands"][1]
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o500)
    bad = checks(CLOUDTRAIN_SLURM_PARTITION="gpu-huge", CLOUDTRAIN_SLURM_STAGING=str(readonly / "x"))
    assert bad["partition"][0] == "missing" and PARTITION in bad["partition"][1], bad
    if not _root():  # root writes anywhere
        assert bad["staging"][0] == "missing", bad
    gone = checks(PATH="/nonexistent")
    assert gone["commands"][0] == "missing" and "sbatch" in gone["commands"][1]


def _root() -> bool:
    import os

    return os.geteuid() == 0


# -- the conformance suite, on the real cluster ----------------------------------------------------------------------


class SlurmHarness(Harness):
    def __init__(self, project: Path, staging: Path) -> None:
        from cloudtrain.providers.slurm.provider import SlurmProvider

        self.project = project
        self.provider = SlurmProvider(log_poll=0.2)
        self.fields = {"providers": {"slurm": {"staging": str(staging), "python": sys.executable,
                                               "partition": PARTITION}}}
        self.status_table = [*((native, state) for native, (state, _) in STATES.items()),
                             (("FAILED", "143:0"), JobState.FAILED), (("CANCELLED by 0", "0:15"), JobState.CANCELLED),
                             ("RUNNING+", JobState.RUNNING)]
        self.native_states = tuple(STATES)  # every state of squeue's man page

    def state_of(self, native: Any) -> JobState:
        return job_state(*native)[0] if isinstance(native, tuple) else job_state(native)[0]

    def native_word(self, native: Any) -> Any:
        return (native[0] if isinstance(native, tuple) else native).split()[0].rstrip("+")

    def lose_next_submit_reply(self) -> None:
        self.provider.lose_next_reply = True  # type: ignore[attr-defined]


class TestSlurm(ProviderConformance):
    @pytest.fixture
    def harness(self, slurm: SlurmCluster, ct_home: Path, tmp_path: Path) -> Harness:  # noqa: F811
        return SlurmHarness(ddp_project(tmp_path), tmp_path / "shared")


# -- offline: the plan is the batch script ---------------------------------------------------------------------------


def test_the_plan_is_the_batch_script(tmp_path: Path, ct_home: Path) -> None:
    project = ddp_project(tmp_path)
    job = Job(script="train_ddp.py", source_dir=str(project), nodes=4, accelerator="A100:8", max_runtime="90m",
              max_restarts=3, env={"WANDB_API_KEY": "s3cr3t-value-123"},
              providers={"slurm": {"staging": "/shared/me/ct", "partition": "gpu", "account": "lab", "qos": "low",
                                   "constraint": "ib", "cpus_per_node": 64, "memory": "512G", "venv": "/shared/venv",
                                   "setup": ["module load cuda/12.1"], "sbatch": ["--exclusive"],
                                   "grace_period": 120}})
    with plan_job(job.spec, "slurm", progress=False) as plan:
        request, script = plan.request, "\n".join(plan.request["script"]) + "\n"  # one entry per line
        shown = json.dumps(plan.to_dict())
    sbatch = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")]
    folder = f"/shared/me/ct/jobs/{plan.job_id}"
    assert sbatch == [f"--job-name={plan.job_id}", "--comment=cloudtrain", "--nodes=4", "--ntasks-per-node=1",
                      f"--chdir={folder}", f"--output={folder}/batch.log",
                      "--open-mode=append", "--time=0-01:30:00", "--signal=TERM@120", "--requeue", "--partition=gpu",
                      "--account=lab", "--qos=low", "--constraint=ib", "--gpus-per-node=a100:8", "--cpus-per-task=64",
                      "--mem=512G", "--exclusive"]
    assert request["sbatch"] == ["sbatch", "--parsable", f"/shared/me/ct/jobs/{plan.job_id}/job.sbatch"]
    assert "module load cuda/12.1" in script and ". /shared/venv/bin/activate" in script
    assert '-gt 3 ]' in script  # max_restarts through SLURM_RESTART_COUNT
    steps = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(steps) == 1 and "--nodes=4 --ntasks-per-node=1" in steps[0]  # one step, one task per node
    assert "s3cr3t-value-123" not in script and "s3cr3t-value-123" not in shown  # in the 0600 env file, masked here
    each_node = next(line for line in plan_text(plan).splitlines() if line.startswith("each node"))
    assert "this machine" not in each_node and "only known there" in each_node  # the nodes' torch, not ours
    assert [n.torchrun[n.torchrun.index("--nproc-per-node") + 1] for n in plan.nodes] == ["8"] * 4
    assert plan.spec.checkpoint.uri == f"file:///shared/me/ct/checkpoints/{plan.spec.checkpoint.uri.rsplit('/', 1)[1]}"
    gres = job.spec.model_copy(deep=True)
    gres.providers.slurm.gpu_flag, gres.providers.slurm.gpu_type = "gres", ""
    with plan_job(gres, "slurm", progress=False) as plan:
        assert "#SBATCH --gres=gpu:8" in plan.request["script"]


def test_the_starter_spec_with_spot_plans_on_slurm(tmp_path: Path, ct_home: Path) -> None:
    """`cloudtrain init` writes spot: true: on Slurm that plans, saying what spot means on a cluster."""
    job = Job(script="train_ddp.py", source_dir=str(ddp_project(tmp_path)), nodes=2, spot=True, max_restarts=3,
              providers={"slurm": {"staging": "/shared/me/ct"}})
    with plan_job(job.spec, "slurm", progress=False) as plan:
        assert "#SBATCH --requeue" in plan.request["script"]
        assert any("Slurm has no spot market" in note and "requeued (max_restarts 3)" in note for note in plan.notes)


def test_the_node_contract_reads_what_srun_gives_each_task() -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_NODEID": "2", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "gpu[07-09]",
           "SLURMD_NODENAME": "gpu09", "SLURM_RESTART_COUNT": "1"}
    found = detect(env)
    assert found["nnodes"] == 3 and found["node_rank"] == 2 and found["master_addr"] == "gpu07"
    assert found["master_port"] == 20000 + (4242 * 7 + 1) % 12000
    assert detect({**env, "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7"})["master_addr"] == "10.0.0.7"
    with pytest.raises(ValueError, match="SLURMD_NODENAME='gpu08' is not host 2"):
        detect({**env, "SLURMD_NODENAME": "gpu08"})
    with pytest.raises(ValueError, match="names 3 hosts, SLURM_NNODES=2"):
        detect({**env, "SLURM_NNODES": "2"})
    with pytest.raises(ValueError, match="not a Slurm task"):
        detect({})


@pytest.mark.parametrize(("option", "value"), [("memory", "lots"), ("staging", "relative/dir"),
                                               ("sbatch", "exclusive"), ("grace_period", "100000"),
                                               ("partition", "two words")])
def test_bad_options_are_refused_by_their_field(tmp_path: Path, ct_home: Path, option: str, value: str) -> None:
    project = ddp_project(tmp_path)
    setting = f"providers.slurm.{option}=" + (json.dumps([value]) if option == "sbatch" else value)
    done = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train_ddp.py", "--provider", "slurm", "--set",
                           setting], cwd=project, env=cli_env(ct_home), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"providers.slurm.{option}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_submit_refuses_a_staging_folder_it_cannot_write(cli: Cli, tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    before = clients.Commands().queued()
    done = cli("submit", "train_ddp.py", "--provider", "slurm", "--set", f"providers.slurm.staging={blocked}/ct",
               "--detach", check=False)
    assert done.returncode == 2 and "providers.slurm.staging" in done.stderr and "Traceback" not in done.stderr
    assert clients.Commands().queued() == before  # nothing submitted


def test_submit_refuses_a_plan_without_a_staging_folder(tmp_path: Path, ct_home: Path) -> None:
    from cloudtrain.errors import UserError

    job = Job(script="train_ddp.py", source_dir=str(ddp_project(tmp_path)))
    with job.plan("slurm") as plan:
        assert any("staging is not set" in note for note in plan.notes)
    with pytest.raises(UserError, match=r"providers\.slurm\.staging") as refused:
        job.submit("slurm")
    assert "CLOUDTRAIN_SLURM_STAGING" in (refused.value.remedy or "")


# -- over SSH: this machine is not a login node; `slurm-login` (tests/sshd.py) is ----------------------------------


@pytest.mark.slow
def test_a_job_submitted_over_ssh_to_the_login_host(slurm: SlurmCluster, sshd: Sshd, tmp_path: Path,  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SLURM_CONF here, every Slurm command and every file of the job's folder goes through ssh (the user's
    OpenSSH config): submit stages the bundle and submits, status, logs, list, cancel and doctor read it back."""
    monkeypatch.delenv("SLURM_CONF")  # sbatch here cannot reach the cluster: only the login host knows it
    monkeypatch.setenv("CLOUDTRAIN_SLURM_SSH", sshd.ssh)
    monkeypatch.setenv("CLOUDTRAIN_SLURM_LOGIN", ALIAS)
    cli = Cli(tmp_path / "home", trainer_project(tmp_path), tmp_path / "shared")
    assert shutil.which("sbatch")  # Slurm's programs are here, and reach no cluster from here
    assert subprocess.run(["squeue"], capture_output=True, timeout=60).returncode != 0
    out = (tmp_path / "out").as_uri()
    done = cli(*cli.submit("ddp", "--output-uri", out, "--", "--epochs", "1", procs=1))
    handle = next(word for word in (done.stdout + done.stderr).split() if word.startswith("slurm://"))
    status = cli.status(handle)
    assert status["state"] == "succeeded" and status["login"] == ALIAS, status
    logs = cli.logs(handle)
    assert "[node-1] [cloudtrain] node 1/2 on slurm" in logs and "done: world_size=2" in logs, logs[-3000:]
    env_file = Path(status["job_dir"]) / "job.env"
    assert env_file.stat().st_mode & 0o777 == 0o600  # written over ssh, private from its creation
    assert handle in cli("list", "--provider", "slurm").stdout
    assert cli("cancel", handle).returncode == 0  # ended: nothing to do
    checks = json.loads(cli("doctor", "-p", "slurm", "-o", "json", check=False).stdout)
    found = {c["name"]: c["status"] for c in checks if c["area"] == "slurm"}
    assert found == {"login": "ok", "partition": "ok", "staging": "warn"}, checks  # no staging set: a placeholder


def test_a_job_record_of_another_shape_on_the_shared_filesystem_is_no_traceback(cli: Cli, tmp_path: Path) -> None:
    """Issue 38.9's sibling: status (and so every watcher) reads a job folder's job.json from the cluster's shared
    filesystem; one another version or a hand left in another shape read as a ValueError traceback. Its values of
    the wrong type are read as not there."""
    (cli.project / "quick.py").write_text("print('done')\n")
    cli("submit", "quick.py", "--provider", "slurm", "--nodes", "1", "--procs-per-node", "1",
        "--set", f"providers.slurm.staging={cli.staging}", "--set", f"providers.slurm.python={sys.executable}",
        "--set", f"providers.slurm.partition={PARTITION}", "--checkpoint-uri", (tmp_path / "ckpt").as_uri(), "--detach")
    [record] = cli.staging.glob("jobs/*/job.json")
    handle = f"slurm://{record.parent.name}"
    record.write_text(json.dumps({"max_restarts": "tomorrow", "checkpoint_uri": 7, "output_uri": ["x"]}))
    for command in (["status", handle], ["wait", handle, "--recover"], ["watch", handle, "--poll", "0.2"]):
        done = cli(*command, check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    status = cli.status(handle)
    assert status["state"] == "succeeded" and status["max_restarts"] == 0 and status["checkpoint_uri"] is None


@pytest.mark.slow
def test_a_job_that_published_nothing_never_reads_a_plain_succeeded(cli: Cli) -> None:
    """Issue 37's rule on Slurm: the nodes' end-of-run warnings (here: --checkpoint-dir ckpts for a script that
    saves into ckpt, so nothing was published) reach the job's status. Before: a plain `succeeded` (the words were
    in the node logs only); now each node writes its status file into the job's folder and status names the first
    warning."""
    (cli.project / "saves_elsewhere.py").write_text(
        "import os, torch\nos.makedirs('ckpt', exist_ok=True)\ntorch.save({'w': 1}, 'ckpt/model.pt')\n")
    submit = [*cli.submit("ddp", "--procs-per-node", "1", "--checkpoint-uri",
                          (cli.project.parent / "store").as_uri(), "--checkpoint-dir", "ckpts")]
    submit[1] = "saves_elsewhere.py"
    done = cli(*submit)
    handle = next(word for word in (done.stdout + done.stderr).split() if word.startswith("slurm://"))
    status = cli.status(handle)
    assert status["state"] == "succeeded" and "ckpts" in status["message"], status
    assert "nothing was published" in status["message"] or "is empty" in status["message"], status["message"]

