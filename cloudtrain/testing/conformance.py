"""One conformance suite every provider passes, like fsspec's abstract tests: ``ProviderConformance`` holds the
tests, and each provider's test class inherits them with a ``harness`` fixture that plays the platform's part (a fake
control plane, or the real processes). cloudtrain's own providers use it in tests/test_conformance.py and
tests/test_slurm.py; a plugin's package uses it the same way, with cloudtrain installed (no source checkout).

What every provider must do: plan offline into the same shape, refusing bad options by their field; submit once
per plan, even when the reply to a create is lost and the submit is retried; map every state of its platform onto
cloudtrain's; end ``logs(follow=True)`` when the job ends; cancel idempotently; resubmit where it declares it can;
show up wherever providers are listed (``--help``, ``schema``, ``config``, ``doctor``, ``--emulate``); and its node
contract, emulated on this machine by the local provider, runs the plan's job.

Fixtures it uses: ``harness`` (yours) and ``ct_home`` (cloudtrain's pytest plugin, cloudtrain.testing.fixtures).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import contract, registry
from cloudtrain.errors import SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.home.paths import resource_dir
from cloudtrain.jobs.recovery import restart_name
from cloudtrain.providers.base import Capability, JobState, Provider
from cloudtrain.sdk import Job, plan_job
from cloudtrain.spec.model import JobSpec, validate_spec

PRINTS = "import os\nprint('conformance says hi from rank', os.environ['RANK'], flush=True)\n"
SLEEPS = "import time\ntime.sleep(300)\n"


class Harness(ABC):
    """A provider, and the platform's part for the tests."""

    provider: Provider
    project: Path
    fields: dict[str, Any] = {}  # spec fields this provider's jobs need (its providers.<name> block ...)
    status_table: list[tuple[Any, JobState]]  # the platform's states and what they mean

    @abstractmethod
    def state_of(self, native: Any) -> JobState: ...

    def spec(self, script: str = "prints.py", **fields: Any) -> JobSpec:
        (self.project / "prints.py").write_text(PRINTS)
        (self.project / "sleeps.py").write_text(SLEEPS)
        return Job(script=script, source_dir=str(self.project), **{**self.fields, **fields}).spec

    @abstractmethod
    def lose_next_submit_reply(self) -> None:
        """The next create reaches the platform, and its answer is lost."""

    def play(self, handle: JobHandle, lines: list[str]) -> None:  # noqa: B027 - a platform may have no part
        """The platform runs the job: it prints ``lines`` and ends. (Real providers run it themselves.)"""

    def preempt(self, handle: JobHandle) -> None:
        raise NotImplementedError


def cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``cloudtrain ARGS`` as a user runs it, seeing the modules (and so the plugins) this process sees."""
    path = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, contract.HOME: str(home), "PYTHONPATH": path}, timeout=240)


def _written(home: Path) -> set[str]:
    """What is under the cloudtrain home, less its temp folder and its derived-data cache (``home.derived``: slices of
    an SDK's installed data, rebuilt from those files at will; no job state)."""
    return {str(p.relative_to(home)) for p in home.rglob("*") if p.relative_to(home).parts[0] not in ("tmp", "cache")} \
        if home.exists() else set()


class ProviderConformance:
    """Inherit it with a ``harness`` fixture (returning a Harness) to run the suite for a provider."""

    def test_plan_shape_and_offline_validation(self, harness: Harness, ct_home: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        provider = harness.provider

        def refused(*_args: Any) -> None:
            raise AssertionError("a plan must not open, bind or connect a socket (plans are pure)")

        monkeypatch.setattr(socket.socket, "bind", refused)
        monkeypatch.setattr(socket.socket, "connect", refused)
        before = _written(ct_home)
        with plan_job(harness.spec(nodes=2), provider, progress=False) as plan:
            assert _written(ct_home) == before  # nothing staged, recorded or prepared (the bundle is a temp file)
            assert plan.provider == provider.name == registry.declaration(provider.name).name
            assert [n.rank for n in plan.nodes] == [0, 1]
            for node in plan.nodes:
                line = node.torchrun
                assert line[line.index("--nnodes") + 1] == "2"
                assert "--node-contract" in node.argv and registry.declaration(
                    provider.contract(plan.spec).name).node_path() in node.argv
            document = json.loads(json.dumps(plan.to_dict()))
            assert document["job_id"] == plan.job_id and document["request"]
        with pytest.raises(SpecError) as unknown:  # its options model, unknown keys refused by their field
            validate_spec({"script": "prints.py", "providers": {provider.name: {"no_such_option": 1}}})
        assert f"providers.{provider.name}.no_such_option" in unknown.value.message

    def test_submit_retried_after_a_lost_reply_creates_one_job(self, harness: Harness) -> None:
        provider = harness.provider
        harness.lose_next_submit_reply()
        with plan_job(harness.spec(script="sleeps.py"), provider, progress=False) as plan:
            handle = provider.submit(plan)
            assert provider.submit(plan) == handle  # the same plan again: the same job
        same = [s for s in provider.list(100) if s.handle == handle]
        assert len(same) == 1
        provider.cancel(handle)

    def test_status_mapping_table(self, harness: Harness) -> None:
        for native, expected in harness.status_table:
            assert harness.state_of(native) is expected, native
        covered = {expected for _, expected in harness.status_table}
        assert {JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} <= covered

    def test_logs_follow_ends_when_the_job_ends(self, harness: Harness) -> None:
        provider = harness.provider
        with plan_job(harness.spec(), provider, progress=False) as plan:
            handle = provider.submit(plan)
        lines: list[str] = []
        follower = threading.Thread(target=lambda: lines.extend(provider.logs(handle, follow=True)), daemon=True)
        follower.start()
        harness.play(handle, ["conformance says hi from rank 0"])
        follower.join(timeout=180)
        assert not follower.is_alive(), "logs(follow=True) did not end with the job"
        assert provider.describe(handle).state.terminal
        assert any("conformance says hi from rank 0" in line for line in lines), lines[-20:]

    def test_cancel_is_idempotent(self, harness: Harness) -> None:
        provider = harness.provider
        with plan_job(harness.spec(script="sleeps.py"), provider, progress=False) as plan:
            handle = provider.submit(plan)
        first = provider.cancel(handle)  # asked to stop: it may take a moment
        assert first.state in (JobState.PENDING, JobState.RUNNING, JobState.STOPPING, JobState.CANCELLED), first
        ended = provider.wait(handle, timeout=120, poll=0.2)
        assert ended.state is JobState.CANCELLED, ended
        again = provider.cancel(handle)  # a job that ended: nothing changes
        assert again.state is JobState.CANCELLED

    def test_resubmit_where_declared(self, harness: Harness) -> None:
        provider = harness.provider
        with plan_job(harness.spec(script="sleeps.py"), provider, progress=False) as plan:
            handle = provider.submit(plan)
        if Capability.RESUBMIT not in provider.capabilities:
            with pytest.raises(UserError, match="cannot resubmit"):
                provider.resubmit(handle, restart_name(handle.job_id, 1))
            provider.cancel(handle)
            return
        harness.preempt(handle)
        assert provider.wait(handle, timeout=60, poll=0.1).state is JobState.PREEMPTED
        again = provider.resubmit(handle, restart_name(handle.job_id, 1))  # the name recovery asks for
        assert provider.resubmit(handle, restart_name(handle.job_id, 1)) == again  # retried: the same job
        assert again != handle and not provider.describe(again).state.terminal

    @pytest.mark.slow
    def test_the_node_contract_emulated_locally_runs_the_plans_job(self, harness: Harness, ct_home: Path) -> None:
        """The local provider runs two nodes under this provider's node contract (the same module the plan's
        torchrun lines come from, shipped in the bundle): they meet, all-reduce, and the job succeeds."""
        platform = registry.declaration(harness.provider.name).platform_name
        trainer = resource_dir("entrypoints") / "plain_torchrun.py"
        (harness.project / "plain_torchrun.py").write_text(trainer.read_text())
        emulate: dict[str, Any] = {} if platform == "local" else {"providers": {"local": {"emulate": platform}}}
        job = Job(script="plain_torchrun.py", source_dir=str(harness.project), nodes=2, procs_per_node=1, **emulate)
        with job.plan("local") as plan:
            assert plan.request["emulate"] == (None if platform == "local" else platform)
            planned = [n.torchrun for n in plan.nodes]
        run = job.submit("local")
        status = run.wait(timeout=240, poll=0.5, progress=False)
        logs = "\n".join(run.logs())
        assert status.state is JobState.SUCCEEDED, logs[-3000:]
        assert "all_reduce ok: True world_size=2" in logs
        for rank, line in enumerate(planned):
            assert f"node {rank}/2 on {platform}" in logs
            assert line[line.index("--nnodes") + 1] == "2"

    def test_shows_up_wherever_providers_are_listed(self, harness: Harness, ct_home: Path) -> None:
        """``--help``, ``schema`` (its options block, unknown keys refused), ``config`` (each setting it declares),
        ``doctor`` (its checks) and ``--emulate`` (its node contract) name the provider, as they name the built-ins."""
        decl = registry.declaration(harness.provider.name)
        name, project = decl.name, harness.project
        helped = cli(ct_home, "plan", "--help", cwd=project)
        assert helped.returncode == 0 and name in helped.stdout, helped.stderr[-2000:]
        contract = decl.node and name != "local"
        if contract:
            assert decl.platform_name in helped.stdout  # --emulate's choices
        assert name in cli(ct_home, "doctor", "--help", cwd=project).stdout
        schema = json.loads(cli(ct_home, "schema", cwd=project).stdout)
        block = schema["$defs"]["ProviderOptions"]["properties"][name]
        if decl.options:
            ref = next(s["$ref"] for s in [block, *block.get("anyOf", [])] if "$ref" in s).rsplit("/", 1)[1]
            assert schema["$defs"][ref]["additionalProperties"] is False
        shown = cli(ct_home, "config", "-p", name, "-o", "json", cwd=project)
        assert shown.returncode == 0, shown.stderr[-2000:]
        keys = {s["key"] for s in json.loads(shown.stdout)["settings"]}
        assert {f"providers.{name}.{key}" for key in decl.env} <= keys
        checked = cli(ct_home, "doctor", "-p", name, "-o", "json", cwd=project)
        assert checked.returncode in (0, 1), checked.stderr[-2000:]  # 1: something is missing on this machine
        assert any(c["area"] == name for c in json.loads(checked.stdout)) or not decl.doctor
        if contract:
            (project / "prints.py").write_text(PRINTS)
            planned = cli(ct_home, "plan", "prints.py", "--nodes", "2", "--emulate", decl.platform_name, "-o", "json",
                          cwd=project)
            assert planned.returncode == 0, planned.stderr[-2000:]
            plan = json.loads(planned.stdout)
            assert plan["request"]["emulate"] == decl.platform_name
            argv = plan["nodes"][0]["argv"]
            assert argv[argv.index("--node-contract") + 1] == decl.node_path()  # shipped in the bundle's lib/
