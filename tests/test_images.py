"""The torch a node runs is the torch the plan names: pinned images with known torch and Python on every cloud, the
same torch minor for the default spec where the platforms allow it (a loud note where not), images whose Python
the bootstrap cannot run refused at plan time, and `cloudtrain init`'s templates planning on all three clouds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.platforms import images
from cloudtrain.sdk import Job
from cloudtrain.spec.model import load_spec
from tests.conftest import REPO

CLOUD_SETTINGS = {"AWS_REGION": "eu-west-1", "CLOUDTRAIN_AWS_ROLE": "arn:aws:iam::123456789012:role/r",
                  "CLOUDTRAIN_AWS_BUCKET": "bkt", "CLOUDTRAIN_GCP_PROJECT": "p", "CLOUDTRAIN_GCP_BUCKET": "bkt",
                  "CLOUDTRAIN_GCP_REGION": "us-central1"}


@pytest.fixture
def clouds(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CLOUD_SETTINGS.items():
        monkeypatch.setenv(key, value)


def test_azure_environments_are_pinned_versions_never_a_moving_label(clouds: None, project: Path) -> None:
    for version, entry in images.table("azure")["environments"].items():
        with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": version}).plan("azure") as p:
            assert p.image == (f"azureml://registries/azureml/environments/{entry['name']}/versions/"
                               f"{entry['version']}")
            assert p.request["job"]["environment"] == p.image and "labels" not in p.image
            assert p.runtime is not None
            assert (p.runtime.torch, p.runtime.python) == (entry["torch"], entry["python"])
            assert images.minor(p.runtime.torch) == version  # the torch the spec asked for, not the env's name
    # the case: the environment named 2.2 runs torch 2.5.1 at the version cloudtrain pins for 2.5
    assert images.table("azure")["environments"]["2.5"]["name"] == "acpt-pytorch-2.2-cuda12.1"


def test_default_spec_runs_one_torch_minor_where_the_clouds_allow_and_says_where_not(clouds: None,
                                                                                     project: Path) -> None:
    seen = {}
    for cloud in ("aws", "azure", "gcp"):
        with Job(script="train_ddp.py", source_dir=str(project), accelerator="A100:8").plan(cloud) as plan:
            assert plan.runtime is not None
            seen[cloud] = (plan.runtime.torch, plan.runtime.python)
            differs = [n for n in plan.notes if "TORCH DIFFERS" in n]
            assert bool(differs) is (cloud == "gcp"), plan.notes
            # every version the clouds share is older than the Checkpointer runs on: the advice says for whom
            assert all(n.endswith("to run the same torch everywhere (a script that saves its own checkpoints: "
                                  "cloudtrain.runtime's Checkpointer needs torch 2.4 or newer)") for n in differs)
            assert plan.to_dict()["runtime"]["torch"] == plan.runtime.torch
    assert seen == {"aws": ("2.5.1", "3.11"), "azure": ("2.5.1", "3.10"), "gcp": ("2.4", "3.10")}
    common = images.common_minors()
    assert "2.2" in common and "2.5" not in common
    for cloud in ("aws", "azure", "gcp"):  # a version every cloud has: the same torch minor everywhere, no note
        with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": "2.2"}).plan(cloud) as plan:
            assert plan.runtime is not None and images.minor(plan.runtime.torch) == "2.2"
            assert not [n for n in plan.notes if "TORCH DIFFERS" in n]


def test_every_image_a_plan_can_pick_runs_a_python_the_bootstrap_supports() -> None:
    oldest = images.version_key(images.data()["min_python"])
    for table in (images.table("azure")["environments"], images.table("gcp")["containers"]):
        assert all(images.version_key(entry["python"]) >= oldest for entry in table.values())
    assert oldest == (3, 8)  # tests/test_bootstrap.py runs under this interpreter in CI (nox -s bootstrap)


@pytest.mark.parametrize(("cloud", "torch", "message"), [
    ("aws", "1.8", "runs Python 3.6; cloudtrain's bootstrap needs Python 3.8"),
    ("aws", "1.2", "runs Python 3.6"),
    ("gcp", "2.5", "Vertex has no PyTorch 2.5 image"),
    ("azure", "2.3", "Azure ML has no PyTorch 2.3 image"),
])
def test_an_image_that_cannot_run_the_bootstrap_or_does_not_exist_is_refused_at_plan_time(
        cloud: str, torch: str, message: str, project: Path) -> None:
    env = {**os.environ, **CLOUD_SETTINGS, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train_ddp.py", "-p", cloud, "--set",
                             f"image.torch_version={torch}"], cwd=project, env=env, capture_output=True, text=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "image.torch_version" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("template", ["ddp", "fsdp"])
def test_init_template_plans_on_every_cloud_as_written_and_says_which_torch(template: str, tmp_path: Path) -> None:
    env = {**os.environ, **CLOUD_SETTINGS, "PYTHONPATH": str(REPO)}
    made = subprocess.run([sys.executable, "-m", "cloudtrain", "init", "--template", template], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    written = (tmp_path / "cloudtrain.yaml").read_text()
    promised = dict(re.findall(r"(aws|azure|gcp): (torch [\d.]+, Python [\d.]+)", written))
    assert set(promised) == {"aws", "azure", "gcp"}
    for cloud in ("aws", "azure", "gcp"):
        result = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "-p", cloud, "-o", "json"],
                                cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, (cloud, result.stderr)
        runtime = json.loads(result.stdout)["runtime"]
        assert f"torch {runtime['torch']}, Python {runtime['python']}" == promised[cloud]
        text = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "-p", cloud], cwd=tmp_path, env=env,
                              capture_output=True, text=True).stdout
        assert re.search(rf"each node\s+torch {re.escape(runtime['torch'])}", text)
    assert load_spec(tmp_path / "cloudtrain.yaml").image.model_fields_set == set()  # left to each cloud


def test_a_torch_older_than_the_checkpointer_runs_on_is_said_in_the_plan(clouds: None, project: Path) -> None:
    """torch 2.2, a version every cloud has (what TORCH DIFFERS suggests for one torch everywhere), stopped the
    reference trainers on every node with an ImportError from deep in torch, after the machines had started."""
    for cloud in ("aws", "azure", "gcp"):
        with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": "2.2"}).plan(cloud) as plan:
            said = [n for n in plan.notes if "TOO OLD FOR CLOUDTRAIN.RUNTIME" in n]
            assert plan.runtime is not None and plan.runtime.torch and len(said) == 1, plan.notes
            assert said[0].startswith(f"{cloud}: TORCH 2.2 IS TOO OLD FOR CLOUDTRAIN.RUNTIME: the nodes run torch "
                                      f"{plan.runtime.torch}, and cloudtrain.runtime's Checkpointer"), said
            assert "needs torch 2.4 or newer" in said[0] and "choose image.torch_version 2.4 or newer" in said[0]
        with Job(script="train_ddp.py", source_dir=str(project)).plan(cloud) as plan:  # 2.5, or Vertex's 2.4
            assert not [n for n in plan.notes if "TOO OLD" in n], plan.notes
    with Job(script="train_ddp.py", source_dir=str(project), image={"uri": "example.com/mine:1"}).plan("gcp") as plan:
        assert not [n for n in plan.notes if "TOO OLD" in n]  # a custom image's torch is unknown


def test_a_custom_image_says_torch_is_only_known_on_the_node(clouds: None, project: Path) -> None:
    with Job(script="train_ddp.py", source_dir=str(project), image={"uri": "example.com/mine:1"}).plan("gcp") as p:
        assert p.runtime is not None and p.runtime.torch is None
        assert "only known on the node" in p.runtime.summary()


def test_the_plan_says_when_this_machines_torch_is_not_the_clouds(clouds: None, project: Path) -> None:
    """29.7: a local run on torch 2.13 of a job whose cloud image has 2.5 said nothing, though the plan knew both."""
    here = images.this_machine().torch
    if here is None:
        pytest.skip("no torch on this machine")
    cloud = "2.2" if images.minor(here) != "2.2" else "2.4"  # a minor every cloud has, and not this machine's
    with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": cloud}).plan("local") as plan:
        said = [n for n in plan.notes if "IN THE CLOUD" in n]
        assert said == [f"local: TORCH {images.minor(here)} HERE, {cloud} IN THE CLOUD: this machine runs torch "
                        f"{here}, a cloud image torch {cloud} (image.torch_version): a run here does not show that "
                        f"the script works there; test with torch=={cloud}.* here, or choose image.torch_version"]
    with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": cloud}).plan("aws") as plan:
        assert plan.runtime is not None and plan.runtime.torch
        said = [n for n in plan.notes if "ON THE NODES" in n]
        assert len(said) == 1 and said[0].startswith(f"aws: TORCH {cloud} ON THE NODES, {images.minor(here)} HERE")
    same = images.minor(here)  # the same minor here and in the spec: nothing to say
    with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": same}).plan("local") as plan:
        assert not [n for n in plan.notes if "IN THE CLOUD" in n]
    with Job(script="train_ddp.py", source_dir=str(project), image={"uri": "example.com/mine:1"}).plan("gcp") as plan:
        assert not [n for n in plan.notes if "ON THE NODES" in n]  # a custom image's torch is unknown
