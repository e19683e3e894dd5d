"""Azure plans are checked offline against a snapshot of azure-ai-ml's command job schema: the snapshot is what the
installed SDK defines, the checker rejects what the SDK's own ``load_job`` rejects (and accepts what it accepts),
and the REST body a plan shows is the one the SDK builds."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.errors import SpecError
from cloudtrain.providers.azure import job as aj
from cloudtrain.providers.azure import rest
from cloudtrain.providers.azure.derive_schema import derive
from cloudtrain.providers.azure.provider import load_validated
from cloudtrain.providers.azure.schema import check_job, job_errors, snapshot
from cloudtrain.sdk import Job
from tests.azure_sdk import assert_rest_body_is_the_sdks, sdk_rejects, sdk_rest_body
from tests.conftest import REPO, ddp_project

# pytest-xdist: the module-scoped azure-ai-ml schema loads below are made once, on one worker
pytestmark = pytest.mark.xdist_group("azure-schema")
INPUT = "abfss://data@acct.dfs.core.windows.net/train/"


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("code")
    (folder / "bootstrap.py").write_text("")
    return folder


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Planned command jobs: serverless spot with an input, a named cluster, and an inline image."""
    project = ddp_project(tmp_path_factory.mktemp("azure-schema"))
    specs = {
        "spot-input": {"nodes": 2, "accelerator": "A100:8", "spot": True, "inputs": {"train": INPUT}},
        "cluster": {"nodes": 2, "providers": {"azure": {"compute": "gpu-cluster"}}},
        "image": {"image": {"uri": "myregistry.azurecr.io/train:1"}, "tags": {"team": "vision"}},
    }
    found = {}
    for name, fields in specs.items():
        with Job(script="train_ddp.py", source_dir=str(project), **fields).plan("azure") as plan:
            found[name] = copy.deepcopy(plan.request["job"])
    return found


def test_the_snapshot_is_what_the_installed_sdk_defines() -> None:
    """The offline check reads a snapshot of azure-ai-ml's CommandJobSchema; it must match the installed SDK.
    Regenerate: python -m cloudtrain.providers.azure.derive_schema > cloudtrain/providers/azure/command_job_schema.json
    """
    assert derive() == snapshot()


def test_planned_jobs_pass_both(jobs: dict[str, dict[str, Any]], code: Path) -> None:
    for job in jobs.values():
        assert job_errors(job) == [] and sdk_rejects(job, code) is None


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(job: dict[str, Any]) -> None:
        node = job
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _drop(*path: str) -> Callable[[dict[str, Any]], None]:
    def change(job: dict[str, Any]) -> None:
        node = job
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return change


REJECTED = [  # (change to the spot-input job, what cloudtrain's message says)
    # wrong types
    (_set(("resources", "instance_count"), "two"), "resources.instance_count: expected an integer"),
    (_set(("resources", "instance_count"), True), "resources.instance_count: expected an integer"),
    (_set(("distribution", "process_count_per_instance"), [1]), "process_count_per_instance: expected an integer"),
    (_set(("limits", "timeout"), "1 day"), "limits.timeout: expected an integer"),
    (_set(("command",), 5), "command: expected a string"),
    (_set(("name",), ["a"]), "name: expected a string"),
    (_set(("tags", "cloudtrain.managed"), 1), "tags.cloudtrain.managed: expected a string"),
    (_set(("resources",), "Standard_NC6"), "resources: expected a mapping"),
    (_set(("inputs", "train", "path"), 5), "inputs.train"),
    (_set(("display_name",), None), "display_name: may not be null"),
    # unknown keys
    (_set(("instance_count",), 2), "instance_count: unknown field"),
    (_set(("resources", "gpus"), 8), "resources.gpus: unknown field"),
    (_set(("limits", "max_runtime"), 60), "limits.max_runtime: unknown field"),
    (_set(("queue_settings", "tier"), "spot"), "queue_settings.tier: unknown field"),
    (_set(("distribution", "nproc"), 8), "distribution.nproc: unknown field"),
    (_set(("inputs", "train", "uri"), INPUT), "inputs.train.uri: unknown field"),
    (_set(("environment",), {"image": "x:1", "docker": "y"}), "environment.docker: unknown field"),
    # bad enum values
    (_set(("distribution", "type"), "torchrun"), "distribution.type: 'torchrun' is not one of pytorch"),
    (_set(("queue_settings", "job_tier"), "low_priority"), "'low_priority' is not one of spot"),
    (_set(("inputs", "train", "type"), "folder"), "'folder' is not one of uri_file, uri_folder"),
    (_set(("inputs", "train", "mode"), "mount"), "'mount' is not one of download"),
    (_set(("type",), "commandjob"), "type: 'commandjob' is not one of command"),
    # missing required fields
    (_drop("command"), "command: required, missing"),
    (_drop("environment"), "environment: required, missing"),
    (_drop("distribution", "type"), "distribution.type: required, missing"),
    # references the schema's string types check
    (_set(("environment",), "acpt-pytorch"), "environment"),
    (_set(("environment",), "azureml:team/env:1"), "an ARM id must start with '/'"),
    (_set(("environment",), "azureml:/subscriptions/s/resourceGroups/r/providers/Microsoft.MachineLearningServices"
                            "/workspaces/w/environments/e"), "an ARM id without a version"),
    # what the SDK checks after the schema
    (_drop("inputs"), "command: uses ${{inputs.train}}, which inputs does not define"),
    (_set(("environment",), {"conda_file": "env.yml"}), "needs an image or a build"),
]


@pytest.mark.parametrize(("change", "message"), REJECTED)
def test_what_load_job_rejects_the_checker_rejects(jobs: dict[str, dict[str, Any]], code: Path,
                                                   change: Callable[[dict[str, Any]], None], message: str) -> None:
    job = copy.deepcopy(jobs["spot-input"])
    change(job)
    assert sdk_rejects(job, code), "azure-ai-ml accepts this job: the case proves nothing"
    errors = job_errors(job)
    assert any(message in e for e in errors), errors


ACCEPTED = [  # loose values azure-ai-ml accepts: the checker must not be stricter than load_job
    _set(("resources", "instance_count"), "3"), _set(("resources", "instance_count"), 2.0),
    _set(("distribution", "type"), "PyTorch"), _set(("queue_settings", "job_tier"), "Spot"),
    _set(("compute",), "gpu-cluster"), _set(("compute",), "azureml:gpu-cluster"),
    _set(("environment",), "azureml:my-env"), _set(("environment",), "azureml:my-env@latest"),
    _set(("environment",), {"image": "x:1"}), _set(("environment_variables", "N"), 3),
    _set(("tags", "note"), None), _set(("$schema",), 5), _set(("status",), "Running"),
    _set(("inputs", "train", "mode"), "ro_mount"), _set(("inputs", "lr"), 0.1),
]


@pytest.mark.parametrize("change", ACCEPTED)
def test_what_load_job_accepts_the_checker_accepts(jobs: dict[str, dict[str, Any]], code: Path,
                                                   change: Callable[[dict[str, Any]], None]) -> None:
    job = copy.deepcopy(jobs["spot-input"])
    change(job)
    assert sdk_rejects(job, code) is None
    assert job_errors(job) == []


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if (*prefix, key) != ("code",):  # a local path: whether it exists is the SDK's to check at submit
                yield (*prefix, key)
                yield from _paths(value, (*prefix, key))


VALUES = st.sampled_from([None, 0, 1, -1, 2.5, True, "", "x", "2", "spot", "Spot", "pytorch", "uri_folder",
                          "azureml:env:1", "azureml:a/b", "azureml://registries/r/environments/e/versions/1",
                          [], ["a"], {}, {"type": "pytorch"}, {"image": "img:1"}, {"job_tier": "basic"}]
                         ).map(copy.deepcopy)  # a fresh list or mapping each time: edits must not change the pool


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_checker_and_load_job_agree_on_changed_jobs(jobs: dict[str, dict[str, Any]], code: Path,
                                                         data: st.DataObject) -> None:
    """Random edits of planned jobs (a value replaced, a key dropped or added): both accept, or both reject."""
    job = copy.deepcopy(jobs[data.draw(st.sampled_from(sorted(jobs)), label="job")])
    for _ in range(data.draw(st.integers(1, 2), label="edits")):
        path = data.draw(st.sampled_from(sorted(_paths(job), key=repr)), label="path")
        parent = job
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "drop", "add"]), label="action")
        if action == "replace":
            parent[path[-1]] = data.draw(VALUES, label="value")
        elif action == "drop":
            del parent[path[-1]]
        elif isinstance(parent[path[-1]], dict):
            parent[path[-1]][data.draw(st.sampled_from(["extra", "type", "image"]), label="key")] = \
                data.draw(VALUES, label="value")
    sdk, ours = sdk_rejects(job, code), job_errors(job)
    assert bool(sdk) == bool(ours), f"azure-ai-ml: {sdk}\ncloudtrain: {ours}\njob: {job}"


@pytest.mark.parametrize("seconds", [1, 59, 60, 3599, 3600, 86399, 86400, 90061, 7 * 86400, 400 * 86400 + 1])
def test_timeouts_are_written_as_the_sdk_writes_them(seconds: int) -> None:
    from azure.ai.ml._utils.utils import to_iso_duration_format

    assert rest.iso_duration(seconds) == to_iso_duration_format(seconds)


def test_rest_body_is_the_sdks_own(jobs: dict[str, dict[str, Any]], code: Path) -> None:
    for job in jobs.values():
        assert_rest_body_is_the_sdks(job, code)


def test_single_brackets_in_a_command_are_sent_as_the_sdk_sends_them(jobs: dict[str, dict[str, Any]],
                                                                      code: Path) -> None:
    job = copy.deepcopy(jobs["spot-input"])
    job["command"] += " --data {inputs.train} --out {outputs.model}x{{inputs.keep}}"
    assert rest.body(job)["properties"]["command"] == sdk_rest_body(load_validated(job, str(code)))["properties"][
        "command"]


def test_planning_imports_no_azure_sdk(project: Path) -> None:
    """Planning reads the schema snapshot: no azure-ai-ml (1-2 s), marshmallow, azure-core or azure-identity."""
    code = (f"from cloudtrain.sdk import Job\n"
            f"Job(script='train_ddp.py', source_dir={str(project)!r}, accelerator='A100:8', nodes=2, spot=True,"
            f" inputs={{'train': {INPUT!r}}}).plan('azure').__exit__()")
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            cwd=REPO, env=dict(os.environ), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:") and "|" in line}
    heavy = {m for m in loaded if m.startswith(("azure.ai.ml", "azure.core", "azure.identity", "marshmallow"))}
    assert not heavy and "cloudtrain.providers.azure.schema" in loaded


def test_a_job_azure_ml_would_reject_is_a_clear_error_naming_the_spec_field(
        cli: Callable[..., subprocess.CompletedProcess[str]], project: Path) -> None:
    result = cli("plan", "train_ddp.py", "--provider", "azure", "--set", "providers.azure.environment=team/env:1",
                 cwd=project)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "providers.azure.environment" in result.stderr and "an ARM id must start with '/'" in result.stderr
    assert "fix: change providers.azure.environment" in result.stderr


@pytest.mark.parametrize(("change", "field"), [
    (_set(("resources", "instance_count"), "two"), "nodes"),
    (_set(("resources", "instance_type"), 5), "providers.azure.instance_type"),
    (_set(("tags", "team"), ["a"]), "tags"),
    (_set(("queue_settings", "job_tier"), "cheap"), "spot"),
    (_set(("replicas",), 2), "providers.azure"),
])
def test_the_error_names_the_spec_field_behind_the_job_field(jobs: dict[str, dict[str, Any]],
                                                             change: Callable[[dict[str, Any]], None],
                                                             field: str) -> None:
    job = copy.deepcopy(jobs["spot-input"])
    change(job)
    with pytest.raises(SpecError) as info:
        check_job(job, aj.SPEC_FIELDS)
    assert info.value.field == field and f"change {field}" in str(info.value.remedy)
