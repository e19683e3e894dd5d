"""One conformance suite every provider passes, like fsspec's abstract tests: ``ProviderConformance`` holds the
tests, and each provider's test class inherits them with a ``harness`` fixture that plays the platform's part (a fake
control plane, or the real processes). cloudtrain's own providers use it in tests/test_conformance.py and
tests/test_slurm.py; a plugin's package uses it the same way, with cloudtrain installed (no source checkout).

What every provider must do: plan offline into the same shape, refusing bad options by their field; derive job
names its platform accepts (its declared ``name_pattern``), however long or odd the spec's name, and refuse one that
breaks the rule by the field ``name``; hand out handles that print and parse back, and refuse another provider's or an
unknown job's cleanly (exit 2); describe a job in the JSON ``status -o json`` documents; refuse at plan time what it
does not declare it can do (``capabilities``), and accept what it does; submit once per plan, even when the reply to a
create is lost and the submit is retried; map every state of its platform onto cloudtrain's, leaving none of the
states its module lists unmapped; end ``logs(follow=True)`` when the job ends; cancel idempotently; resubmit where it
declares it can; show up wherever providers are listed (``--help``, ``schema``, ``config``, ``doctor``,
``--emulate``); and its node contract, emulated on this machine by the local provider, runs the plan's job.

Fixtures it uses: ``harness`` (yours) and ``ct_home`` (cloudtrain's pytest plugin, cloudtrain.testing.fixtures).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import contract, registry
from cloudtrain.bundle.staging import saved_job_id
from cloudtrain.errors import HandleError, SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.home.paths import resource_dir
from cloudtrain.jobs.recovery import restart_name
from cloudtrain.providers.base import Capability, JobState, JobStatus, Provider
from cloudtrain.sdk import Job, plan_job
from cloudtrain.spec.model import JobSpec, validate_spec

PRINTS = "import os\nprint('conformance says hi from rank', os.environ['RANK'], flush=True)\n"
SLEEPS = "import time\ntime.sleep(300)\n"
LONGEST_NAME = "a-forty-character-experiment-name-abcdef"  # the longest name a spec takes
ODD_SCRIPTS = ("Mixed Case_and.dots -- v2.py", "9.py")  # names derived from script names like these
BAD_NAME = "Not A Job Name, " + "x" * 300  # breaks every platform's rule: spaces, a comma, capitals, its length
UNKNOWN_JOB = "no-such-job-20200101-000000-0000"


class Harness(ABC):
    """A provider, and the platform's part for the tests."""

    provider: Provider
    project: Path
    fields: dict[str, Any] = {}  # spec fields this provider's jobs need (its providers.<name> block ...)
    status_table: list[tuple[Any, JobState]]  # the platform's states and what they mean
    # Every state of the platform's vocabulary, as the provider's module lists it (SageMaker's status pairs, Slurm's
    # state words ...): the table must give each one its meaning. ``native_word`` reads a table row's native as one
    # of them (a row may add what else decides the state: an error message, a reason).
    native_states: tuple[Any, ...] = ()
    accelerator: str = "A100:8"  # a GPU request this provider's plans take (Capability.ACCELERATORS)

    @abstractmethod
    def state_of(self, native: Any) -> JobState: ...

    def native_word(self, native: Any) -> Any:
        return native

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

    def test_job_names_obey_the_platforms_rule(self, harness: Harness) -> None:
        """The job id a plan derives, and a resubmission's, match the declared ``name_pattern`` for the longest name
        a spec takes and for names derived from odd script names. A name the spec refuses is an error naming the field
        ``name``; one that breaks the platform's rule (a saved plan's, edited by hand) is refused naming it, or made to
        fit; a resubmission's is refused by the field ``name`` before the platform is asked."""
        provider = harness.provider
        decl = registry.declaration(provider.name)
        for script in ODD_SCRIPTS:
            (harness.project / script).write_text(PRINTS)
        for fields in ({"name": LONGEST_NAME}, *({"script": script} for script in ODD_SCRIPTS)):
            with plan_job(harness.spec(**fields), provider, progress=False) as plan:
                names = [plan.job_id]
            if Capability.RESUBMIT in provider.capabilities:  # the names recovery resubmits it as
                names += [restart_name(plan.job_id, 1), restart_name(plan.job_id, 12)]
            for name in names:
                assert decl.name_pattern is None or re.fullmatch(decl.name_pattern, name), (name, decl.name_rule)
        with pytest.raises(SpecError) as refused:
            harness.spec(name="Not_A Name")
        assert "\n  name: " in refused.value.message and "set name" in (refused.value.remedy or "")
        if decl.name_pattern is None:
            return
        spec = harness.spec()
        try:  # a name the platform refuses is refused by the plan, or made to fit the rule
            with saved_job_id(BAD_NAME), plan_job(spec, provider, progress=False) as plan:
                assert re.fullmatch(decl.name_pattern, plan.job_id), (plan.job_id, decl.name_rule)
        except UserError as broke:
            assert broke.exit_code == 2 and broke.remedy and BAD_NAME[:14] in broke.message, broke.message
            assert broke.field != "name" or (decl.name_rule or decl.name_pattern) in broke.message, broke.message
        if Capability.RESUBMIT in provider.capabilities:  # checked before the platform is asked anything
            somewhere = JobHandle(provider.name, "job", tuple("scope" for _ in decl.handle_scope))
            with pytest.raises(SpecError) as renamed:
                provider.resubmit(somewhere, BAD_NAME)
            assert renamed.value.field == "name"

    def test_handles_round_trip_and_foreign_or_unknown_ones_are_clean_errors(self, harness: Harness) -> None:
        """A submit's handle prints and parses back to itself, names the provider and has the declared form; a
        handle of another provider, of another form, or of a job the platform does not have is an error (exit 2)
        naming the handle, never a traceback."""
        provider = harness.provider
        decl = registry.declaration(provider.name)
        with plan_job(harness.spec(script="sleeps.py"), provider, progress=False) as plan:
            handle = provider.submit(plan)
        try:
            assert JobHandle.parse(str(handle)) == handle
            assert handle.provider == provider.name and handle.job_id
            assert len(handle.scope) == len(decl.handle_scope)
            assert str(handle).startswith(f"{provider.name}://"), str(handle)
            other = "local" if provider.name != "local" else "aws"
            for wrong in (JobHandle(other, handle.job_id, handle.scope), JobHandle(provider.name, handle.job_id,
                                                                                  (*handle.scope, "extra"))):
                with pytest.raises(UserError) as refused:
                    provider.describe(wrong)
                assert refused.value.exit_code == 2 and str(wrong) in refused.value.message
            unknown = JobHandle(provider.name, UNKNOWN_JOB, handle.scope)
            with pytest.raises(HandleError) as missing:
                provider.describe(unknown)
            assert missing.value.exit_code == 2 and UNKNOWN_JOB in missing.value.message
        finally:
            provider.cancel(handle)

    def test_status_json_has_the_documented_keys(self, harness: Harness) -> None:
        """``JobStatus.to_dict()`` (``status -o json``) of a submitted job, as described and as listed: the documented
        keys with their types, a state among cloudtrain's, and JSON all through."""
        provider = harness.provider
        with plan_job(harness.spec(script="sleeps.py"), provider, progress=False) as plan:
            handle = provider.submit(plan)
        try:
            listed = next(s for s in provider.list(100) if s.handle == handle)
            for status in (provider.describe(handle), listed):
                assert isinstance(status, JobStatus) and status.handle == handle
                document = status.to_dict()
                assert json.loads(json.dumps(document)) == document
                assert document["handle"] == str(handle) and isinstance(document["name"], str)
                assert document["state"] in {state.value for state in JobState}
                assert isinstance(document["message"], str)
                for key in ("created_at", "started_at", "ended_at"):
                    assert document[key] is None or isinstance(document[key], (int, float)), (key, document[key])
                since = document.get("state_since")  # only where the platform says when the state began
                assert since is None or (isinstance(since, (int, float)) and not isinstance(since, bool)), since
                for key in ("output_uri", "checkpoint_uri"):  # always there, null when unknown
                    assert document[key] is None or isinstance(document[key], str), (key, document[key])
                for key in ("restarts", "max_restarts"):
                    assert document.get(key) is None or isinstance(document[key], int), (key, document[key])
                nodes = document.get("nodes")
                assert nodes is None or all(isinstance(n, dict) for n in nodes), nodes
        finally:
            provider.cancel(handle)

    def test_capabilities_are_checked_at_plan_time(self, harness: Harness, ct_home: Path) -> None:
        """What a spec asks for that the provider does not declare (spot, several nodes, accelerators) is refused
        when it is planned, naming it, with nothing written; what it declares plans. Resubmit and preempt, where not
        declared, are refused by name before the platform is asked."""
        provider = harness.provider
        needs: dict[Capability, dict[str, Any]] = {Capability.SPOT: {"spot": True}, Capability.MULTI_NODE: {"nodes": 2},
                 Capability.ACCELERATORS: {"accelerator": harness.accelerator}}
        for capability, fields in needs.items():
            before = _written(ct_home)
            if capability in provider.capabilities:
                with plan_job(harness.spec(**fields), provider, progress=False) as plan:
                    assert plan.spec.model_dump(include=set(fields)) == fields, capability
                continue
            spec = harness.spec(**fields)
            with pytest.raises(UserError) as refused, plan_job(spec, provider, progress=False):
                pass
            assert capability.value in refused.value.message and refused.value.exit_code == 2, refused.value.message
            assert _written(ct_home) == before
        somewhere = JobHandle(provider.name, "job", tuple("scope" for _ in provider.declaration.handle_scope))
        if Capability.RESUBMIT not in provider.capabilities:
            with pytest.raises(UserError, match="cannot resubmit"):
                provider.resubmit(somewhere, "job-r1")
        if Capability.PREEMPT not in provider.capabilities:
            with pytest.raises(UserError, match="cannot be preempted"):
                provider.preempt(somewhere)

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

    def test_every_native_state_is_mapped(self, harness: Harness) -> None:
        """Each state the provider's module lists for its platform (``Harness.native_states``) has its meaning in the
        table, and maps onto one of cloudtrain's states: none is left to a default."""
        assert harness.native_states, "the harness states no native_states: the platform's full list of job states"
        for native in harness.native_states:
            assert isinstance(harness.state_of(native), JobState), native
        stated = {harness.native_word(native) for native, _ in harness.status_table}
        unmapped = [native for native in harness.native_states if native not in stated]
        assert not unmapped, f"states of the platform without a row in the status table: {unmapped}"

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
