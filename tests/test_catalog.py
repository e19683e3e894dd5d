"""The accelerator catalog: every row checked against the platforms' own names (botocore's SageMaker model, Vertex's
AcceleratorType enum), what ``--gpus`` resolves to on each cloud, the estimate every cloud plan carries, and
``cloudtrain catalog`` / ``cloudtrain plan`` as a user reads them. All offline: planning only."""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.cli.main import main
from cloudtrain.cli.render import catalog_text, estimate_text, plan_text
from cloudtrain.errors import SpecError
from cloudtrain.platforms import catalog
from cloudtrain.providers.gcp.machines import Machine as VertexMachine
from cloudtrain.providers.gcp.machines import accelerators, machine_for
from cloudtrain.sdk import Job

CLOUDS = ("aws", "azure", "gcp")
ROLE = "arn:aws:iam::123456789012:role/cloudtrain-tests"
# a plan's region on purpose differs from the catalog's price region (aws us-east-1, gcp us-central1)
OFFLINE = {"AWS_REGION": "eu-west-1", "CLOUDTRAIN_AWS_ROLE": ROLE, "CLOUDTRAIN_AWS_BUCKET": "my-bucket",
           "CLOUDTRAIN_GCP_PROJECT": "my-project", "CLOUDTRAIN_GCP_REGION": "europe-west4",
           "CLOUDTRAIN_GCP_BUCKET": "my-bucket"}
A100X8 = {"aws": "ml.p4d.24xlarge", "azure": "Standard_ND96asr_v4", "gcp": "a2-highgpu-8g"}
CLI = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Settings for offline plans on every cloud, and nothing from this machine's own cloud tools or profiles."""
    env = {**OFFLINE, "CLOUDTRAIN_CONFIG": str(tmp_path / "config.yaml"), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
           "AWS_CONFIG_FILE": str(tmp_path / "aws-config")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_DEFAULT_REGION", "AWS_PROFILE", "CLOUDTRAIN_PROFILE", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    return env


def job(project: Path, **fields: Any) -> Job:
    return Job(script="train_ddp.py", source_dir=str(project), **fields)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI in this process (fast; the subprocess tests below cover the real entry point)."""
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the table itself -----------------------------------------------------------------------------------

NAMES = {"aws": r"^ml\.[a-z0-9]+\.[a-z0-9]+$", "azure": r"^Standard_[A-Z]+[0-9]+[a-z]*(_[A-Za-z0-9]+)*$",
         "gcp": r"^(n1|g2|a2|a3|a4)-[a-z]+-[0-9]+g?$"}
REGIONS = {"aws": r"^[a-z]{2}-[a-z]+-[0-9]$", "azure": r"^[a-z]+[0-9]?$", "gcp": r"^[a-z]+-[a-z]+[0-9]$"}
# Vertex machine families that come with their GPUs: the family says which accelerator, the name how many
VERTEX_FAMILY = {
    "a2-highgpu": "NVIDIA_TESLA_A100", "a2-megagpu": "NVIDIA_TESLA_A100", "a2-ultragpu": "NVIDIA_A100_80GB",
    "a3-highgpu": "NVIDIA_H100_80GB", "a3-megagpu": "NVIDIA_H100_MEGA_80GB", "a3-ultragpu": "NVIDIA_H200_141GB",
    "a4-highgpu": "NVIDIA_B200", "g2-standard": "NVIDIA_L4",
}
N1_ACCELERATORS = {"NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100"}


@pytest.mark.parametrize("provider", CLOUDS)
def test_every_row_is_well_formed(provider: str) -> None:
    rows = catalog.machines(provider)
    assert len(rows) >= 10
    for m in rows:
        assert m.provider == provider
        assert re.match(NAMES[provider], m.instance_type), m
        assert (m.gpus > 0) is (m.gpu is not None), m
        if m.gpu:
            assert re.match(r"^[A-Z0-9][A-Z0-9-]*$", m.gpu) and m.gpu_memory_gb and m.gpu_memory_gb >= 16, m
            assert m.accelerator == f"{m.gpu}:{m.gpus}"
        else:
            assert m.gpu_memory_gb is None and m.accelerator == "-"
        assert m.vcpus and m.vcpus > 0 and m.memory_gb and m.memory_gb > 0, m
        assert m.confidence in ("sourced", "recalled"), m
        for price in (m.on_demand, m.spot):
            assert price is None or (isinstance(price, (int, float)) and 0 < price < 200), m
        if m.on_demand is not None and m.spot is not None:
            assert m.spot <= m.on_demand, m
        assert (m.accelerator_type is not None) is (provider == "gcp" and m.gpu is not None), m
        assert "cpu_default" not in m.to_dict() and m.to_dict()["instance_type"] == m.instance_type
    defaults = [m for m in rows if m.cpu_default]
    assert len(defaults) == 1 and defaults[0].gpu is None and defaults[0].on_demand is not None
    # lookup takes the first row for a model and count: a second one would never be chosen
    gpu_rows = [(m.gpu, m.gpus) for m in rows if m.gpu]
    assert len(gpu_rows) == len(set(gpu_rows))
    # an instance type appears once (Vertex: once per attached accelerator)
    names = [(m.instance_type, m.accelerator_type) for m in rows]
    assert len(names) == len(set(names))

    source = catalog.price_source(provider)
    assert source.provider == provider
    for text in (source.region, source.as_of, source.source, source.spot_note):
        assert isinstance(text, str) and len(text.strip()) >= 4
    assert "http" in source.source + source.spot_note
    # issue 29.9: a note that reads as unchecked ("per brief; not re-verified here") reads as a bug to a user
    assert not re.search(r"per brief|not re-verified", source.source + source.spot_note, re.IGNORECASE)
    assert re.match(REGIONS[provider], source.region), source.region
    assert set(source.to_dict()) == {"provider", "region", "as_of", "source", "spot_note"}


def test_aws_instance_types_are_sagemaker_training_types() -> None:
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    member = model.operation_model("CreateTrainingJob").input_shape.members["ResourceConfig"].members["InstanceType"]
    assert member.name == "TrainingInstanceType"
    valid = set(model.shape_for("TrainingInstanceType").enum)
    assert len(valid) > 50
    rows = catalog.machines("aws")
    assert [m.instance_type for m in rows if m.instance_type not in valid] == []


def test_gcp_rows_name_real_vertex_accelerators_matching_their_machine_family() -> None:
    from google.cloud.aiplatform_v1.types import AcceleratorType

    valid = set(AcceleratorType.__members__) - {"ACCELERATOR_TYPE_UNSPECIFIED"}
    assert "NVIDIA_TESLA_A100" in valid
    for m in catalog.machines("gcp"):
        if m.gpu is None:
            assert m.instance_type.startswith("n1-")
            continue
        assert m.accelerator_type in valid, m
        family = m.instance_type.rsplit("-", 1)[0]
        if m.instance_type.startswith("n1-"):
            assert m.accelerator_type in N1_ACCELERATORS, m
        else:
            assert VERTEX_FAMILY[family] == m.accelerator_type, m
        if m.instance_type.startswith(("a2-", "a3-", "a4-")):  # a2-highgpu-8g: 8 GPUs
            assert m.instance_type.endswith(f"-{m.gpus}g"), m
    # one Vertex accelerator per GPU model: accelerators() (model -> type) must not lose a row
    pairs = {(m.gpu, m.accelerator_type) for m in catalog.machines("gcp") if m.gpu}
    assert len({gpu for gpu, _ in pairs}) == len(pairs)
    assert accelerators()["A100"] == "NVIDIA_TESLA_A100" and accelerators()["H100"] == "NVIDIA_H100_80GB"


def test_unknown_provider_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        catalog.machines("local")
    assert info.value.field == "--provider" and "aws, azure, gcp" in info.value.message


# -- what --gpus resolves to ----------------------------------------------------------------------------

def test_a100x8_resolves_per_provider() -> None:
    for provider, expected in A100X8.items():
        assert catalog.instance_for(provider, "A100", 8, None) == expected
        assert catalog.instance_for(provider, "A100", 8, "explicit-wins") == "explicit-wins"
        chosen = catalog.lookup(provider, "A100", 8)
        assert chosen is not None and (chosen.gpu, chosen.gpus, chosen.gpu_memory_gb) == ("A100", 8, 40)
    assert machine_for("A100", 8, None, None) == VertexMachine("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8)
    assert machine_for("H100", 8, None, None) == VertexMachine("a3-highgpu-8g", "NVIDIA_H100_80GB", 8)
    assert machine_for(None, 0, None, None) == VertexMachine("n1-standard-8", None, 0)
    # no GPUs: the one CPU default of each provider
    assert {p: catalog.lookup(p, None, 0).instance_type for p in CLOUDS} == {  # type: ignore[union-attr]
        "aws": "ml.m5.xlarge", "azure": "Standard_DS3_v2", "gcp": "n1-standard-8"}


def test_azure_single_a100_falls_back_to_the_80gb_nc_a100_v4() -> None:
    one = catalog.lookup("azure", "A100", 1)
    assert one is not None
    assert (one.instance_type, one.gpu, one.gpus, one.gpu_memory_gb) == ("Standard_NC24ads_A100_v4", "A100-80GB", 1,
                                                                         80)
    assert catalog.lookup("azure", "A100", 2).instance_type == "Standard_NC48ads_A100_v4"  # type: ignore[union-attr]
    # where the 40 GB part exists, it is the one chosen
    assert catalog.lookup("azure", "A100", 8).instance_type == "Standard_ND96asr_v4"  # type: ignore[union-attr]
    assert catalog.offered("azure", "A100") == [1, 2, 4, 8]
    # no fallback elsewhere, nor for other models
    assert catalog.lookup("aws", "A100", 1) is None and catalog.lookup("azure", "T4", 2) is None
    # `cloudtrain catalog --gpus A100:1` lists the machine a plan would get
    assert [m.instance_type for m in catalog.search("azure", "A100:1")] == ["Standard_NC24ads_A100_v4"]
    assert [m.instance_type for m in catalog.search("azure", "a100")] == [
        "Standard_NC24ads_A100_v4", "Standard_NC48ads_A100_v4", "Standard_NC96ads_A100_v4", "Standard_ND96asr_v4"]
    assert [m.instance_type for m in catalog.search("gcp", "A100:8")] == ["a2-highgpu-8g"]
    assert [m.instance_type for m in catalog.search(None, "A100-80GB:8")] == [
        "ml.p4de.24xlarge", "Standard_ND96amsr_A100_v4", "a2-ultragpu-8g"]


@pytest.mark.parametrize(("provider", "accelerator", "listed", "not_listed"), [
    ("aws", "A100:3", ["A100:8"], ["A100:1"]),
    ("azure", "A100:3", ["A100:1, A100:2, A100:4, A100:8"], ["A100:3"]),
    ("gcp", "A100:3", ["A100:1, A100:2, A100:4, A100:8, A100:16"], ["A100:3"]),
    ("aws", "T4:2", ["T4:1, T4:4"], ["T4:0"]),  # the CPU row is no T4 machine
    ("azure", "FOO:2", ["known GPU models on azure", "A100", "H100", "V100"], ["FOO:0"]),
])
def test_unknown_count_lists_what_exists(offline: dict[str, str], project: Path, provider: str, accelerator: str,
                                         listed: list[str], not_listed: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        job(project, accelerator=accelerator).plan(provider)
    error = info.value
    assert error.field == "accelerator" and error.exit_code == 2
    for text in listed:
        assert text in error.message
    for text in not_listed:
        assert text not in error.message
    assert f"cloudtrain catalog --provider {provider}" in (error.remedy or "")


def test_unknown_count_through_the_cli_exits_2_without_a_traceback(cli: CLI, project: Path,
                                                                  offline: dict[str, str]) -> None:
    result = cli("plan", "train_ddp.py", "-p", "aws", "--gpus", "A100:3", cwd=project, env_extra=offline)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "accelerator: no aws machine with 3 x A100" in result.stderr and "A100:8" in result.stderr
    assert "fix:" in result.stderr and "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("text", ["x:0", "A100:00", "A100:", ":8", "A100:8:2", "A100:-1", "A100:two", ""])
def test_bad_gpus_filter_names_the_flag(text: str) -> None:
    with pytest.raises(SpecError) as info:
        catalog.search(None, text) if text else catalog.parse_accelerator(text)
    assert info.value.field == "--gpus"


def test_gpus_filter_parses_model_and_count() -> None:
    assert catalog.parse_accelerator("a100:8") == ("A100", 8)
    assert catalog.parse_accelerator("h100") == ("H100", 1)
    assert catalog.parse_accelerator("A100-80GB:16") == ("A100-80GB", 16)


# -- estimates in plans -----------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", CLOUDS)
def test_spot_plan_estimate_is_consistent_with_the_catalog(offline: dict[str, str], project: Path,
                                                           provider: str) -> None:
    with job(project, nodes=2, accelerator="A100:8", spot=True, max_runtime="2h").plan(provider) as plan:
        assert plan.machine is not None and plan.machine.instance_type == A100X8[provider]
        row = catalog.find(provider, A100X8[provider], plan.machine.accelerator_type, 8)
        assert row is not None and row == plan.machine and row.on_demand
        est = plan.estimate
        assert est is not None and est["available"] is True
        assert (est["currency"], est["instance_type"], est["nodes"], est["max_runtime_hours"], est["billed_as"]) == (
            "USD", A100X8[provider], 2, 2.0, "spot")
        source = catalog.price_source(provider)
        assert (est["price_region"], est["as_of"], est["source"]) == (source.region, source.as_of, source.source)
        on_demand = est["on_demand"]
        assert on_demand["per_node_hour"] == round(row.on_demand, 4)
        assert on_demand["hourly"] == round(on_demand["per_node_hour"] * 2, 2)
        assert math.isclose(on_demand["max_runtime"], on_demand["hourly"] * 2, abs_tol=0.011)
        if row.spot is None:
            assert est["spot"] is None and est["spot_note"] == source.spot_note
        else:
            spot = est["spot"]
            assert spot["per_node_hour"] == round(row.spot, 4) and "spot_note" not in est
            assert spot["hourly"] == round(row.spot * 2, 2)
            assert math.isclose(spot["max_runtime"], spot["hourly"] * 2, abs_tol=0.011)
            assert spot["hourly"] < on_demand["hourly"]
        region = plan.staging.get("region")
        if region and region != source.region:
            assert est["region_note"] == f"prices are {source.region} list prices; {region} may differ"
        else:
            assert "region_note" not in est
        assert "capacity_note" not in est
        assert json.loads(json.dumps(plan.to_dict()))["estimate"] == est
    # which of these differ from the price region is fixed by OFFLINE (azure plans carry no region)
    assert {"aws": "eu-west-1", "gcp": "europe-west4", "azure": None}[provider] == plan.staging.get("region")
    if provider == "aws":  # SageMaker spot has no list price
        assert est["spot"] is None and "spot_note" in est
    if provider == "gcp":
        assert est["spot"] == {"per_node_hour": 11.5436, "hourly": 23.09, "max_runtime": 46.17}
        assert est["on_demand"] == {"per_node_hour": 33.7952, "hourly": 67.59, "max_runtime": 135.18}


@pytest.mark.parametrize("provider", CLOUDS)
def test_on_demand_plan_is_billed_on_demand(offline: dict[str, str], project: Path, provider: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-east-1")  # the price regions: no region note
    monkeypatch.setenv("CLOUDTRAIN_GCP_REGION", "us-central1")
    with job(project, accelerator="H100:8", max_runtime="90m").plan(provider) as plan:
        est = plan.estimate
        assert est is not None and est["available"] and est["billed_as"] == "on_demand"
        assert est["nodes"] == 1 and est["max_runtime_hours"] == 1.5 and "region_note" not in est
        assert est["on_demand"]["hourly"] == round(plan.machine.on_demand, 2)  # type: ignore[union-attr,arg-type]
        assert plan.machine.gpu == "H100"  # type: ignore[union-attr]
        first = estimate_text(est)[0]
        assert re.search(r"on-demand \$[0-9,.]+/h, up to \$[0-9,.]+ in 1h30m \(billed\)", first), first


@pytest.mark.parametrize("provider", CLOUDS)
def test_more_processes_than_gpus_is_refused(offline: dict[str, str], project: Path, provider: str) -> None:
    with pytest.raises(SpecError) as info:
        job(project, accelerator="A100:8", procs_per_node=9).plan(provider)
    assert info.value.field == "procs_per_node"
    assert f"9 processes per node, but {A100X8[provider]} has 8 GPU(s)" in info.value.message
    assert "at most 8" in (info.value.remedy or "")


@pytest.mark.parametrize("provider", CLOUDS)
def test_fewer_processes_than_gpus_is_a_note(offline: dict[str, str], project: Path, provider: str) -> None:
    with job(project, accelerator="A100:8", procs_per_node=4).plan(provider) as plan:
        assert plan.nproc_per_node == 4
        assert f"{provider}: 4 process(es) per node use 4 of the 8 GPUs of {A100X8[provider]}" in plan.notes
    with job(project, accelerator="A100:8").plan(provider) as plan:  # one per GPU: nothing to say
        assert plan.nproc_per_node == 8 and not any("process(es) per node use" in n for n in plan.notes)


@pytest.mark.parametrize(("provider", "options", "instance"), [
    ("aws", {"instance_type": "ml.p3dn.24xlarge"}, "ml.p3dn.24xlarge"),
    ("azure", {"instance_type": "Standard_NV36ads_A10_v5"}, "Standard_NV36ads_A10_v5"),
    ("gcp", {"machine_type": "n1-highmem-16", "accelerator_type": "NVIDIA_TESLA_T4"}, "n1-highmem-16"),
])
def test_explicit_instance_type_outside_the_catalog_has_no_estimate(offline: dict[str, str], project: Path,
                                                                    provider: str, options: dict[str, str],
                                                                    instance: str) -> None:
    with job(project, spot=True, providers={provider: options}).plan(provider) as plan:
        assert plan.machine is not None and plan.machine.instance_type == instance
        assert plan.machine.on_demand is None
        est = plan.estimate
        assert est is not None and est["available"] is False and est["billed_as"] == "spot"
        assert instance in est["reason"] and "cloudtrain catalog" in est["reason"]
        assert "on_demand" not in est and "hourly" not in json.dumps(est)
        assert estimate_text(est) == [f"unavailable: {est['reason']}"]
        summary = plan_text(plan)
    if provider == "gcp":  # the machine still says which GPUs it has, from the accelerator type
        assert (plan.machine.gpu, plan.machine.gpus, plan.machine.accelerator_type) == ("T4", 1, "NVIDIA_TESLA_T4")
        assert f"instance     {instance} (1 x T4)" in summary
    else:  # no GPU data: the summary says the catalog doesn't know it, never "no GPU"
        assert f"instance     {instance} (not in cloudtrain's catalog)" in summary


def test_catalog_machine_without_a_list_price_has_no_estimate(offline: dict[str, str], project: Path) -> None:
    with job(project, accelerator="H200:8").plan("aws") as plan:
        assert plan.machine is not None and plan.machine.instance_type == "ml.p5e.48xlarge"
        assert plan.estimate is not None and plan.estimate["available"] is False
        assert "ml.p5e.48xlarge" in plan.estimate["reason"]


def test_local_plans_have_no_estimate(offline: dict[str, str], project: Path) -> None:
    with job(project, nodes=2, spot=True).plan("local") as plan:
        assert plan.estimate is None and plan.to_dict()["estimate"] is None
    assert estimate_text(None) == ["none (runs on this machine)"]


def test_vertex_flex_start_is_billed_as_flex_start(offline: dict[str, str], project: Path) -> None:
    with job(project, accelerator="A100:8", max_runtime="2h",
             providers={"gcp": {"capacity": "flex_start"}}).plan("gcp") as plan:
        est = plan.estimate
        assert est is not None and est["available"] and est["billed_as"] == "flex_start"
        assert "flex-start" in est["capacity_note"] and "on-demand is the upper bound" in est["capacity_note"]
        assert plan.request["customJob"]["jobSpec"]["scheduling"]["strategy"] == "FLEX_START"
        lines = estimate_text(est)
        assert "(billed)" not in lines[0] and est["capacity_note"] in lines
    with job(project, accelerator="A100:8", providers={"gcp": {"capacity": "spot"}}).plan("gcp") as plan:
        assert plan.estimate is not None and plan.estimate["billed_as"] == "spot"
        assert "capacity_note" not in plan.estimate


def test_estimate_text_marks_the_billed_rate() -> None:
    gcp = catalog.find("gcp", "a2-highgpu-8g", "NVIDIA_TESLA_A100", 8)
    spot = catalog.estimate(gcp, 2, "spot", 7200, "europe-west4")
    lines = estimate_text(spot)
    assert lines[0] == "on-demand $67.59/h, up to $135.18 in 2h; spot $23.09/h, up to $46.17 in 2h (billed)"
    assert lines[1].startswith("2 node(s) x a2-highgpu-8g, us-central1 list prices as of ")
    assert lines[2] == "prices are us-central1 list prices; europe-west4 may differ"
    aws = catalog.find("aws", "ml.p4d.24xlarge")
    lines = estimate_text(catalog.estimate(aws, 1, "spot", 3600, "us-east-1"))
    assert lines[0] == "on-demand $25.25/h, up to $25.25 in 1h; spot: no list price (billed)" and len(lines) == 2
    lines = estimate_text(catalog.estimate(aws, 1, "on_demand", 3600))
    assert lines[0] == "on-demand $25.25/h, up to $25.25 in 1h (billed); spot: no list price"
    assert catalog.estimate(None, 1, "spot", 60)["available"] is False


# -- the CLI ------------------------------------------------------------------------------------------------

def test_catalog_text_lists_every_provider_with_sources(cli: CLI, tmp_path: Path) -> None:
    result = cli("catalog", env_extra={"CLOUDTRAIN_CONFIG": str(tmp_path / "config.yaml")})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["PROVIDER", "INSTANCE", "GPUS", "GPU", "MEM", "VCPUS", "ON-DEMAND/H", "SPOT/H"]
    total = sum(len(catalog.machines(p)) for p in CLOUDS)
    rows = lines[1:total + 1]
    assert [r.split()[0] for r in rows] == [m.provider for p in CLOUDS for m in catalog.machines(p)]
    assert [r.split()[1] for r in rows] == [m.instance_type for p in CLOUDS for m in catalog.machines(p)]
    by_name = {(r.split()[0], r.split()[1], r.split()[2]): r for r in rows}
    assert by_name[("aws", "ml.p4d.24xlarge", "A100:8")].split()[3:] == ["40", "GB", "96", "$25.25", "-"]
    assert by_name[("azure", "Standard_NC4as_T4_v3", "T4:1")].split()[3:] == ["16", "GB", "4", "$0.53", "$0.07"]
    assert by_name[("gcp", "a2-highgpu-8g", "A100:8")].split()[3:] == ["40", "GB", "96", "~$33.80", "~$11.54"]
    assert by_name[("gcp", "n1-standard-8", "-")].split()[3:] == ["-", "8", "$0.44", "$0.10"]
    assert lines[total + 1] == ""
    footer = "\n".join(lines[total + 2:])
    for provider in CLOUDS:
        src = catalog.price_source(provider)
        assert f"{provider}: {src.region} list prices as of {src.as_of}, USD per node-hour" in footer
        assert f"Source: {src.source}" in footer and f"  spot: {src.spot_note}" in footer
    assert lines[-1].startswith("~ recalled figure")


def test_catalog_filters_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "catalog", "--provider", "gcp", "--gpus", "H100:8")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("PROVIDER") and lines[1].split()[:5] == ["gcp", "a3-highgpu-8g", "H100:8", "80", "GB"]
    assert lines[2] == "" and lines[3].startswith("gcp: us-central1 list prices")
    assert "aws" not in out and "azure" not in out

    code, out, _ = run_main(capsys, "catalog", "--gpus", "a100:8", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert [(m["provider"], m["instance_type"]) for m in data["machines"]] == list(A100X8.items())
    gcp = data["machines"][2]
    assert gcp == {**catalog.find("gcp", "a2-highgpu-8g", "NVIDIA_TESLA_A100", 8).to_dict()}  # type: ignore[union-attr]
    assert (gcp["gpu"], gcp["gpus"], gcp["accelerator_type"], gcp["on_demand"]) == ("A100", 8, "NVIDIA_TESLA_A100",
                                                                                  33.7952)
    assert set(data["prices"]) == set(CLOUDS)
    assert data["prices"]["aws"] == catalog.price_source("aws").to_dict()
    assert data["prices"]["azure"]["region"] == "eastus" and data["prices"]["gcp"]["region"] == "us-central1"

    code, out, _ = run_main(capsys, "catalog", "-p", "azure", "--gpus", "A100:1", "-o", "yaml")
    data = yaml.safe_load(out)
    assert code == 0 and [m["instance_type"] for m in data["machines"]] == ["Standard_NC24ads_A100_v4"]
    assert list(data["prices"]) == ["azure"]

    code, out, _ = run_main(capsys, "catalog", "-p", "aws", "--gpus", "B200")
    assert (code, out.strip()) == (0, "no machine matches")
    assert catalog_text([]) == "no machine matches"


@pytest.mark.parametrize("gpus", ["x:0", "A100:00"])
def test_catalog_bad_gpus_exits_2(capsys: pytest.CaptureFixture[str], gpus: str) -> None:
    code, out, err = run_main(capsys, "catalog", "--gpus", gpus)
    assert code == 2 and out == ""
    assert f"--gpus: {gpus!r} is not MODEL or MODEL:COUNT" in err and "fix:" in err


def test_catalog_bad_gpus_through_the_cli(cli: CLI) -> None:
    result = cli("catalog", "--gpus", "x:0")
    assert result.returncode == 2 and result.stdout == ""
    assert "--gpus" in result.stderr and "Traceback" not in result.stderr


def test_plan_text_shows_instance_image_estimate_and_torchrun(cli: CLI, project: Path,
                                                             offline: dict[str, str]) -> None:
    result = cli("plan", "train_ddp.py", "-p", "aws", "--gpus", "A100:8", "--nodes", "2", "--spot", "--max-runtime",
                 "2h", "--env", "WANDB_API_KEY=sekrit123", "--env", "PLAIN=visible-value", cwd=project,
                 env_extra=offline)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()
    rows = {line[:12].strip(): line[13:] for line in lines[:lines.index("request:")] if line[:12].strip()}
    assert rows["provider"] == "aws"
    assert rows["instance"] == "ml.p4d.24xlarge (8 x A100 40 GB)"
    assert re.match(r"^[0-9]{12}\.dkr\.ecr\.eu-west-1\.amazonaws\.com/pytorch-training:[0-9.]+-gpu-py3[0-9]+$",
                    rows["image"]), rows["image"]
    assert rows["layout"].startswith("2 node(s) x 8 process(es) = world size 16")
    assert rows["estimate"] == "on-demand $50.50/h, up to $101.01 in 2h; spot: no list price (billed)"
    at = lines.index("estimate" + " " * 5 + rows["estimate"])
    assert lines[at + 1].strip() == ("2 node(s) x ml.p4d.24xlarge, us-east-1 list prices as of 2026-09: an estimate, "
                                     "compute only")
    assert lines[at + 2].strip() == "prices are us-east-1 list prices; eu-west-1 may differ"
    assert rows["env"] == "WANDB_API_KEY=**** PLAIN=visible-value"
    request_at = lines.index("request:")
    node_lines = [n for n, line in enumerate(lines) if line.startswith("node ")]
    assert len(node_lines) == 2 and all(n < request_at for n in node_lines)
    assert "-m torch.distributed.run --nnodes 2 --nproc-per-node 8" in lines[node_lines[0]]
    assert "--node-rank 1" in lines[node_lines[1]]
    request = json.loads("\n".join(lines[request_at + 1:]))
    assert request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge" and request["RoleArn"] == ROLE
    assert request["Environment"]["WANDB_API_KEY"] == "****"
    assert request["Environment"]["PLAIN"] == "visible-value"
    assert "sekrit123" not in out + result.stderr


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_plan_documents_mask_secret_values(offline: dict[str, str], project: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    monkeypatch.chdir(project)
    code, out, err = run_main(capsys, "plan", "train_ddp.py", "-p", "aws", "--gpus", "A100:8", "--env",
                              "WANDB_API_KEY=sekrit123", "--env", "PLAIN=visible-value", "-o", fmt)
    assert code == 0, err
    data = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert data["spec"]["env"] == {"WANDB_API_KEY": "****", "PLAIN": "visible-value"}
    assert data["request"]["Environment"]["WANDB_API_KEY"] == "****"
    assert data["estimate"]["instance_type"] == "ml.p4d.24xlarge" and data["estimate"]["billed_as"] == "on_demand"
    assert "sekrit123" not in out + err and out.count("visible-value") >= 2
