"""Issue 31.1, `plan --compare`: one job planned on every installed provider against the real catalogs, as rows
sorted by cost with what each still needs; a provider that cannot plan it is a row saying why; `submit --provider
cheapest` submits the first row that can run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.platforms import catalog

A100 = ["--gpus", "A100:8", "--nodes", "2", "--spot", "--max-runtime", "10h"]


@pytest.fixture(autouse=True)
def no_settings_from_this_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What each row is missing is read from the settings a user has: none here. The storage emulators export
    GOOGLE_CLOUD_PROJECT into the process that started them (an earlier test on this worker), and gcloud's own
    configuration would answer too."""
    for key in ("CLOUDTRAIN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "AWS_REGION",
                "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))


def compared(cli, project: Path, *flags: str) -> dict:
    result = cli("plan", str(project / "train_ddp.py"), "--compare", *flags, "-o", "json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_every_provider_is_a_row_priced_from_its_catalog_cheapest_first(cli, project: Path) -> None:
    rows = compared(cli, project, *A100)["rows"]
    assert {r["provider"] for r in rows} == {"aws", "azure", "gcp", "local", "slurm", "kubernetes"}
    priced = [r for r in rows if r["hourly"] is not None]
    assert [r["hourly"] for r in priced] == sorted(r["hourly"] for r in priced) and rows[:len(priced)] == priced
    for row in priced:  # the same figures as the catalog's, for 2 nodes, billed spot where spot has a price
        machine = catalog.lookup(row["provider"], "A100", 8)
        assert machine and row["instance"] == machine.instance_type and row["gpus"] == f"8 x {machine.gpu}"
        assert row["on_demand_hourly"] == round(machine.on_demand * 2, 2)  # type: ignore[operator]
        billed = machine.spot if machine.spot is not None else machine.on_demand
        assert row["hourly"] == round(billed * 2, 2) and row["estimate"] == round(row["hourly"] * 10, 2)  # type: ignore[operator]
    by_name = {r["provider"]: r for r in rows}
    # settings not set here: named, and no row is ready but the local one
    # (providers.aws.region too where no AWS region is configured: then it is priced in the catalog's region)
    assert by_name["aws"]["missing"][-2:] == ["providers.aws.role", "providers.aws.bucket"]
    assert by_name["gcp"]["missing"] == ["providers.gcp.project", "providers.gcp.bucket"]
    assert "workspace" in by_name["azure"]["missing"][0] and not by_name["azure"]["ready"]
    assert [r["provider"] for r in rows if r["ready"]] == ["local"]


def test_a_provider_that_cannot_plan_the_job_is_a_row_saying_why(cli, project: Path) -> None:
    rows = {r["provider"]: r for r in compared(cli, project, "--gpus", "H100:3")["rows"]}
    for name in ("aws", "azure", "gcp"):
        assert rows[name]["reason"] and "no " + name in rows[name]["reason"] and "3 x H100" in rows[name]["reason"]
        assert rows[name]["hourly"] is None
    text = cli("plan", str(project / "train_ddp.py"), "--compare", "--gpus", "H100:3").stdout
    assert "cannot run: accelerator: no gcp machine with 3 x H100" in text


def test_regions_are_rows_of_their_own(cli, project: Path) -> None:
    rows = compared(cli, project, *A100, "--region", "gcp=us-central1,europe-west4", "--region", "azure=westus")
    gcp = sorted(r["region"] for r in rows["rows"] if r["provider"] == "gcp")
    assert gcp == ["europe-west4", "us-central1"]
    azure = next(r for r in rows["rows"] if r["provider"] == "azure")
    assert "azure has no region setting" in azure["reason"]
    bad = cli("plan", str(project / "train_ddp.py"), "--compare", "--region", "gcp")
    assert bad.returncode == 2 and "--region: 'gcp' is not PROVIDER=REGION[,REGION]" in bad.stderr


def test_a_budget_below_an_hour_makes_rows_that_cannot_run(cli, project: Path) -> None:
    rows = {r["provider"]: r for r in compared(cli, project, *A100, "--max-cost", "48")["rows"]}
    assert rows["gcp"]["reason"] is None  # $46.18/h on spot: 48 buys more than an hour
    assert "max_cost: $48.00 buys less than one hour" in rows["aws"]["reason"]  # $50.50/h (no spot list price)
    assert "cannot hold a budget without a price" in rows["slurm"]["reason"]


def test_submit_cheapest_takes_the_first_row_that_can_run(cli, project: Path) -> None:
    # local has a price here (a rehearsal price) and needs no settings: the only row that can run
    submitted = cli("submit", str(project / "train_ddp.py"), "-p", "cheapest", "--set",
                    "providers.local.price_per_node_hour=0.5", "--detach", "--", "--epochs", "1")
    assert submitted.returncode == 0, submitted.stderr
    picked = "cheapest: local, this machine, $0.50/h on-demand (of 1 ready"
    assert submitted.stdout.startswith("local://") and picked in submitted.stderr, submitted.stderr
    assert cli("wait", submitted.stdout.strip(), timeout=240).returncode == 0
    none = cli("submit", str(project / "train_ddp.py"), "-p", "cheapest", "--gpus", "A100:8", "--detach")
    assert none.returncode == 2 and "--provider: no provider with a list price can run this job" in none.stderr
    assert "gcp/us-central1: set providers.gcp.project" in none.stderr and "Traceback" not in none.stderr
