"""Tags reach each platform in a form it accepts, whatever the spec holds; what changed is said in the plan."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain import registry
from cloudtrain.errors import SpecError
from cloudtrain.jobs.recovery import restart_name
from cloudtrain.naming import shortened
from cloudtrain.providers.aws.request import user_tags
from cloudtrain.providers.aws.validate import request_errors
from cloudtrain.providers.gcp.request import user_labels
from tests.clouds import azure_project, spec_file
from tests.conftest import cli_env, wait_for
from tests.fakes.azureml import PREEMPTED, AzureMLFake


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return azure_project(tmp_path)


keys = st.text(min_size=1, max_size=200).filter(lambda k: not k.lower().startswith("aws:"))
tag_dicts = st.dictionaries(keys, st.text(max_size=300), max_size=8)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(tag_dicts)
def test_any_tags_become_tags_sagemaker_accepts(tags: dict[str, str]) -> None:
    try:
        sent, notes = user_tags(tags)
    except SpecError as exc:  # two keys that collapse into one: refused, naming the field
        assert exc.field and exc.field.startswith("tags.")
        return
    request = {"Tags": [{"Key": k, "Value": v} for k, v in sent.items()]}
    # botocore's own model is the judge (pattern, lengths); other members are absent on purpose
    assert [e for e in request_errors("sagemaker", "CreateTrainingJob", request) if "Tags" in e] == []
    assert len(notes) == sum(1 for k, v in tags.items() if (k, v) not in sent.items())


@settings(max_examples=150, deadline=None)
@given(tag_dicts)
def test_any_tags_become_valid_vertex_labels(tags: dict[str, str]) -> None:
    try:
        sent, _ = user_labels(tags)
    except SpecError:
        return
    for key, value in sent.items():
        assert re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key) and re.fullmatch(r"[a-z0-9_-]{0,63}", value)


def test_valid_tags_pass_unchanged_and_reserved_ones_are_refused() -> None:
    assert user_tags({"team": "vision", "cost-center": "ml/42"}) == (
        {"team": "vision", "cost-center": "ml/42"}, [])
    sent, notes = user_tags({"owner": "ana<ops>"})
    assert sent == {"owner": "ana_ops_"} and "owner='ana<ops>' sent as owner='ana_ops_'" in notes[0]
    with pytest.raises(SpecError, match="reserves"):
        user_tags({"aws:cloudformation": "x"})
    assert user_labels({"Team": "Vision"})[0] == {"team": "vision"}


# -- issue 38.11: shortened names keep what makes them unique --------------------------------------------------------

NAME = "a-forty-character-experiment-name-abcdef"  # the longest name a spec takes
ROOTS = [f"{NAME}-20261127-101502-{tail}" for tail in ("3f9a", "c0de")]  # two jobs of one name, seconds apart


@pytest.mark.parametrize("provider", sorted(registry.names()))
def test_restart_names_of_two_jobs_of_one_long_name_stay_two_on_every_provider(provider: str) -> None:
    """38.11: restart N was the job id cut at 55 characters, which kept only the name, the date and the tens of
    the seconds: two jobs of a 40-character name submitted seconds apart got one restart name, and Azure ML refused
    the second. Now the name gives way and the stamp stays, within each provider's rule, the same every time."""
    declaration = registry.declaration(provider)
    for restart in (1, 2, 12):
        names = [restart_name(root, restart) for root in ROOTS]
        assert names[0] != names[1], names
        for root, name in zip(ROOTS, names, strict=True):
            assert name == restart_name(root, restart)  # fixed: a retried resubmission finds its job
            assert name.endswith(f"{root[-21:]}-r{restart}") and len(name) <= 60, name
            if declaration.name_pattern:
                assert re.fullmatch(declaration.name_pattern, name), (provider, name)
    if provider == "kubernetes":  # the cluster's own, shorter cut (pod host names) keeps the stamp too
        from cloudtrain.providers.kubernetes.provider import job_name

        cut = [job_name(restart_name(root, 1), "trainjob", 16)[0] for root in ROOTS]
        assert cut[0] != cut[1] and all(len(n) + len("-node-0-15") <= 63 for n in cut), cut


def test_shortened_keeps_the_stamp_the_restart_or_a_digest() -> None:
    assert shortened("short-20261127-101502-3f9a-r1", 60) == "short-20261127-101502-3f9a-r1"
    assert shortened(f"{NAME}-20261127-101502-3f9a-r1", 40) == "a-forty-characte-20261127-101502-3f9a-r1"
    other = [shortened(f"{'x' * 70}{n}-r3", 30) for n in range(2)]  # no stamp: a digest of the head instead
    assert other[0] != other[1] and all(len(n) == 30 and n.endswith("-r3") for n in other), other


def test_two_jobs_of_one_long_name_are_each_resubmitted_on_azure_ml(azure: AzureMLFake, project: Path,
                                                                      ct_home: Path) -> None:
    """38.11 as a user meets it: two spot jobs of one 40-character name, planned within the same ten seconds,
    both preempted, each recovered by `cloudtrain wait --recover`: the second's restart took the first's name, and
    Azure ML refused it ("an Azure ML job named ... already exists")."""
    spec_file(project, spot=True, max_restarts=1, name=NAME)
    env = cli_env(ct_home)

    def plan(out: str) -> str:  # saved beside the project: this is about names, not about what is packaged
        with open(project.parent / out, "w") as sink:
            done = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "-p", "azure", "-o", "json"],
                                  cwd=project, env=env, stdout=sink, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return str(json.loads((project.parent / out).read_text())["job_id"])

    for _ in range(5):  # within one ten-second window, as two submits seconds apart mostly are
        ids = [plan("first.json"), plan("second.json")]
        if ids[0][:55] == ids[1][:55]:
            break
    assert ids[0][:55] == ids[1][:55], ids
    def submitted_preempted_and_recovered(job_id: str, saved: str) -> str:
        submitted = subprocess.run([sys.executable, "-m", "cloudtrain", "submit", "--plan", f"../{saved}", "--detach"],
                                   cwd=project, env=env, capture_output=True, text=True, timeout=120)
        assert submitted.returncode == 0, submitted.stderr
        watcher = subprocess.Popen([sys.executable, "-m", "cloudtrain", "wait", submitted.stdout.strip(), "--recover",
                                    "-o", "json"], cwd=project, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        azure.set_status(job_id, "Failed", PREEMPTED)

        def restart_of() -> str | None:
            return next((n for n, job in azure.jobs.items()
                         if job["properties"]["tags"].get("cloudtrain.restart_of") == job_id), None)

        wait_for(lambda: restart_of() is not None or watcher.poll() is not None, timeout=60)
        restart = restart_of()
        assert restart is not None, watcher.communicate()[1]
        azure.set_status(restart, "Completed")
        out, err = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, err
        assert json.loads(out)["handle"].endswith(restart)
        return restart

    restarts = [submitted_preempted_and_recovered(job_id, saved)
                for job_id, saved in zip(ids, ("first.json", "second.json"), strict=True)]
    assert restarts[0] != restarts[1] and all(r.endswith(f"{i[-21:]}-r1") for r, i in zip(restarts, ids, strict=True))
    assert sorted(azure.jobs) == sorted([*ids, *restarts])
