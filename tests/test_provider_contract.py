"""The provider contract, typed: JobStatus fields for what the core reads (with -o json unchanged), capabilities as
an enum (preempt among them), a provider's name stated once (its declaration), the platform's job-name rule and
handle form declared and checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import registry
from cloudtrain.errors import HandleError, SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import TYPED, Capability, JobState, JobStatus
from cloudtrain.providers.base import Provider
from tests import plugins
from tests.conftest import REPO, cli_env, ddp_project

toy_plugin = plugins.toy_plugin  # a fixture

# `status -o json` of a local job, as releases before the typed fields printed it: scripts read these keys
LOCAL_KEYS = {"handle", "name", "state", "message", "created_at", "started_at", "ended_at", "nodes", "world_size",
              "job_dir", "restarts", "max_restarts", "output_uri", "checkpoint_uri",
              "progress", "goodput", "timeline"}  # the story `status` adds (cloudtrain.show.metrics.story)


def cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(home), "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.fixture
def local_job(ct_home: Path, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    project = ddp_project(tmp_path)
    (project / "quick.py").write_text("print('done')\n")
    done = cli(ct_home, "submit", "quick.py", "--detach", "--max-restarts", "2", "--output-uri",
               (tmp_path / "out").as_uri(), cwd=project)
    assert done.returncode == 0, done.stderr[-2000:]
    handle = done.stdout.strip().splitlines()[-1].split()[-1]
    assert cli(ct_home, "wait", handle, cwd=project).returncode == 0
    yield project, handle


def test_status_json_keeps_its_keys_and_the_core_reads_typed_fields(local_job: tuple[Path, str], ct_home: Path,
                                                                     tmp_path: Path) -> None:
    project, handle = local_job
    shown = json.loads(cli(ct_home, "status", handle, "-o", "json", cwd=project).stdout)
    assert set(shown) == LOCAL_KEYS, set(shown) ^ LOCAL_KEYS
    assert shown["max_restarts"] == 2 and shown["restarts"] == 0 and shown["checkpoint_uri"] is None
    status = registry.get_provider("local").describe(JobHandle.parse(handle))
    assert (status.restarts, status.max_restarts, status.output_uri) == (0, 2, (tmp_path / "out").as_uri())
    assert status.nodes and not set(TYPED) & set(status.details)  # details: the platform's own facts only
    story = {"progress", "goodput", "timeline"}
    assert status.to_dict() == {**{k: v for k, v in shown.items() if k not in story}, "message": status.message}


def test_a_status_made_the_older_way_reads_the_same() -> None:
    """A plugin written before the typed fields puts them in details: they land in the fields, -o json unchanged."""
    older = JobStatus(JobHandle("toy", "j-1"), "j-1", JobState.RUNNING,
                      details={"output_uri": "s3://b/o", "max_restarts": 3, "queue": "gpu"})
    assert (older.output_uri, older.max_restarts, older.details) == ("s3://b/o", 3, {"queue": "gpu"})
    assert older.to_dict()["output_uri"] == "s3://b/o" and older.to_dict()["queue"] == "gpu"


def test_capabilities_are_an_enum_and_preempt_is_one_of_them(ct_home: Path) -> None:
    assert Capability.PREEMPT in registry.get_provider("local").capabilities
    assert all(isinstance(c, Capability) for c in registry.get_provider("aws").capabilities)
    assert "spot" in registry.get_provider("aws").capabilities  # plain strings still test membership
    with pytest.raises(UserError, match="cannot be preempted"):  # refused before anything is asked of AWS
        registry.get_provider("aws").preempt(JobHandle("aws", "job-1", ("us-east-1",)))

    class Older(Provider):  # strings, as plugins wrote them before the enum: accepted, made members
        name = "toy"
        capabilities = frozenset({"multi_node", "resubmit"})  # type: ignore[assignment]

    assert Older.capabilities == {Capability.MULTI_NODE, Capability.RESUBMIT}
    with pytest.raises(TypeError, match="'preemptible' is not a valid Capability; one of multi_node"):
        type("Typo", (Provider,), {"name": "toy", "capabilities": frozenset({"preemptible"})})


def test_a_providers_name_is_its_declarations(toy_plugin: Path) -> None:
    for name in registry.names():
        cls = registry.declaration(name).load("provider")
        assert cls.declaration is registry.declaration(name) and cls.name == name, cls  # stated once: there
    toy = registry.declaration("toy")
    with pytest.raises(TypeError, match="state the name once"):
        type("Renamed", (Provider,), {"declaration": toy, "name": "toy2"})


def test_a_long_name_is_made_to_fit_and_a_name_the_platform_refuses_names_its_rule(toy_plugin: Path, ct_home: Path,
                                                                                    tmp_path: Path) -> None:
    """The toy's spool names at most 48 characters: a long spec name (the spec allows 40, the stamp adds 22) is
    shortened to fit, keeping the stamp; a job id that still breaks the rule is a SpecError naming the rule."""
    import re

    from cloudtrain.naming import check_job_name

    project = ddp_project(tmp_path)
    planned = cli(ct_home, "plan", "train_ddp.py", "--provider", "toy", "--name", "a" * 30, "-o", "json", cwd=project)
    assert planned.returncode == 0, planned.stderr
    declared = registry.declaration("toy")
    job_id = json.loads(planned.stdout)["job_id"]
    assert declared.name_pattern and re.fullmatch(declared.name_pattern, job_id) and job_id.startswith("aaaa")
    with pytest.raises(SpecError, match="at most 48") as refused:
        check_job_name("toy", "a" * 60, declared.name_pattern, declared.name_rule)
    assert refused.value.field == "name"
    with pytest.raises(SpecError, match="a label value"):  # a resubmission's name too, before anything is sent
        registry.get_provider("gcp").resubmit(JobHandle("gcp", "j", ("p", "us-central1")), "UPPER")


@pytest.mark.parametrize(("handle", "form"), [("aws://only-a-job", "aws://<region>/<job>"),
                                              ("gcp://us-central1/job", "gcp://<project>/<region>/<job>"),
                                              ("local://here/job", "local://<job>")])
def test_a_handle_of_the_wrong_form_is_refused_with_the_form(ct_home: Path, tmp_path: Path, handle: str,
                                                             form: str) -> None:
    done = cli(ct_home, "status", handle, cwd=tmp_path)
    assert done.returncode == 2 and form in done.stderr and "Traceback" not in done.stderr, done.stderr
    provider: Any = registry.get_provider(handle.split(":")[0])
    with pytest.raises(HandleError):
        provider.describe(JobHandle.parse(handle))
