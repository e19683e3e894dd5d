"""Issue 31.4, a budget that holds: max_cost is checked at plan time, carried in the plan, and the watcher stops a
real local job (gloo processes, final checkpoint) and a SageMaker job (StopTrainingJob through the front) once the
cost accrued across legs reaches it; `cloudtrain cost` prices every leg."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState
from cloudtrain.jobs import budget, recovery
from cloudtrain.plan import cost
from cloudtrain.sdk import Job, budget_note, chain_of
from tests.fakes.sagemaker import SageMakerFront

SLOW_TRAIN = ["--", "--epochs", "200", "--checkpoint-every", "4", "--step-sleep", "0.05"]
# $180 per node-hour ($0.05/s): $3 is spent some 60 s after the nodes start. At $360 (30 s), a crowded CI machine
# once took all of it to start torchrun and its workers, so the budget stopped a job with nothing yet to checkpoint.
SLOW_PRICE = ["--set", "providers.local.price_per_node_hour=180"]


def test_accrued_prices_each_leg_at_the_rate_it_ran() -> None:
    spot = cost.Rate("aws", "ml.p4d.24xlarge", 2, "spot", on_demand=30.0, spot=10.0)
    on_demand = cost.Rate("gcp", "a2-highgpu-8g", 1, "on_demand", on_demand=40.0, spot=12.0)
    total = cost.accrued([cost.Leg("aws://r/a", 0.0, 1800.0, spot, "preempted", restarts=1),
                          cost.Leg("gcp://p/r/b", 2000.0, None, on_demand, "running"),
                          cost.Leg("aws://r/c", None, None, spot, "pending")], now=2000.0 + 3600)
    assert [round(c.cost or 0, 2) for c in total.legs] == [10.0, 40.0, 0.0]  # 0.5 h x 2 x $10; 1 h x $40; not started
    assert round(total.cost, 2) == 50.0 and round(total.on_demand, 2) == 70.0 and round(total.savings, 2) == 20.0
    assert total.restarts == 2 + 1 and round(total.hours, 2) == 1.5
    unknown = cost.accrued([cost.Leg("slurm://c/1", 0.0, 3600.0, None)])
    assert unknown.cost == 0 and unknown.unpriced == ["slurm://c/1"]


@pytest.mark.parametrize(("flags", "said"), [
    (["--max-cost", "-3"], "max_cost: must be more than 0"),
    (["--max-cost", "abc"], "max_cost: must be an amount in USD"),
    (["--max-cost", "nan"], "max_cost: must be more than 0"),
    (["--max-cost", "5"], "max_cost: cannot hold a budget without a price"),  # local: no list price
    (["-p", "gcp", "--gpus", "A100:8", "--nodes", "2", "--max-cost", "50"],
     "max_cost: $50.00 buys less than one hour of this job: 2 x a2-highgpu-8g cost $67.59/h"),
])
def test_bad_budgets_exit_2_naming_the_field(cli, project: Path, flags: list[str], said: str) -> None:
    result = cli("plan", str(project / "train_ddp.py"), *flags)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_tiny_rehearsal_price_plans_and_a_price_below_a_micro_dollar_is_refused(cli, project: Path) -> None:
    """Issue 38.14: $0.00001 a node-hour with --max-cost 5 ended in ZeroDivisionError (the price rounded to 0 before
    the budget was divided by it). It plans, its price shown as it is; a price that prices nothing (5e-324: a budget
    divided by it overflows) is refused, naming the field."""
    script = str(project / "train_ddp.py")
    for out in ("json", "text"):
        planned = cli("plan", script, "--set", "providers.local.price_per_node_hour=0.00001", "--max-cost", "5",
                      "-o", out)
        assert planned.returncode == 0 and "Traceback" not in planned.stderr, planned.stderr
    spent = json.loads(planned.stdout if out == "json" else cli(
        "plan", script, "--set", "providers.local.price_per_node_hour=0.00001", "--max-cost", "5", "-o",
        "json").stdout)["budget"]
    assert spent["hourly"] == 0.00001 and spent["hours"] == 500_000 and "runtime_cap" not in spent, spent
    assert "$5.00 buys on-demand 20833d8h (billed)" in planned.stdout, planned.stdout
    compared = cli("plan", script, "--compare", "--set", "providers.local.price_per_node_hour=0.00001",
                   "--max-cost", "5")
    assert compared.returncode == 0 and "Traceback" not in compared.stderr, compared.stderr
    assert re.search(r"^local .* ready$", compared.stdout, re.M), compared.stdout
    for price in ("5e-324", "0.0000001"):
        refused = cli("plan", script, "--set", f"providers.local.price_per_node_hour={price}", "--max-cost", "5")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "providers.local.price_per_node_hour: must be at least 0.000001 USD" in refused.stderr, refused.stderr


def test_plan_shows_what_the_budget_buys(cli, project: Path) -> None:
    flags = ["-p", "gcp", "--gpus", "A100:8", "--nodes", "2", "--spot", "--max-cost", "$100"]
    planned = json.loads(cli("plan", str(project / "train_ddp.py"), *flags, "-o", "json").stdout)
    spent = planned["budget"]
    assert spent["max_cost"] == 100 and spent["billed_as"] == "spot" and planned["spec"]["max_cost"] == 100
    assert spent["on_demand_hours"] == round(100 / 67.59, 3) and spent["spot_hours"] == round(100 / 23.09, 3)
    text = cli("plan", str(project / "train_ddp.py"), *flags).stdout
    assert re.search(r"^budget\s+\$100\.00 buys on-demand 1h28m48s, spot 4h19m52s \(billed\)", text, re.M), text


def _stopped_with_final_checkpoint(cli, handle: str, budget_usd: float) -> None:
    status = json.loads(cli("status", handle, "-o", "json").stdout)
    assert status["state"] == "cancelled" and f"stopped: budget USD {budget_usd:.2f} reached" in status["message"]
    logs = cli("logs", handle).stdout
    assert "stop requested: final checkpoint at step" in logs, logs[-3000:]
    priced = json.loads(cli("cost", handle, "-o", "json").stdout)
    assert priced["max_cost"] == budget_usd and budget_usd <= priced["cost"] < budget_usd * 3, priced
    assert priced["legs"][0]["per_node_hour"] == 180 and priced["stopped"].startswith("stopped: budget")
    text = cli("cost", handle).stdout
    assert "total $" in text and "stopped: budget USD" in text


@pytest.mark.slow
def test_a_foreground_submit_stops_a_local_job_at_its_budget(cli, project: Path, tmp_path: Path) -> None:
    result = cli("submit", str(project / "train_ddp.py"), "--procs-per-node", "2", "--checkpoint-uri",
                 (tmp_path / "ckpt").as_uri(), *SLOW_PRICE, "--max-cost", "3", *SLOW_TRAIN, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "stopped: budget USD 3.00 reached after" in result.stderr, result.stderr[-3000:]
    handle = re.search(r"submitted (\S+)", result.stderr).group(1)  # type: ignore[union-attr]
    _stopped_with_final_checkpoint(cli, handle, 3.0)


@pytest.mark.slow
def test_wait_recover_stops_a_detached_local_job_at_its_budget(cli, project: Path, tmp_path: Path) -> None:
    handle = cli("submit", str(project / "train_ddp.py"), "--procs-per-node", "2", "--checkpoint-uri",
                 (tmp_path / "ckpt").as_uri(), *SLOW_PRICE, "--max-cost", "3", "--detach",
                 *SLOW_TRAIN).stdout.strip()
    waited = cli("wait", handle, "--recover", "-o", "json", timeout=300)
    final = json.loads(waited.stdout)
    assert waited.returncode == 1 and final["state"] == "cancelled", waited.stderr[-3000:]
    assert final["recovery"]["budget"].startswith("stopped: budget USD 3.00 reached after"), final
    _stopped_with_final_checkpoint(cli, handle, 3.0)


def test_the_watcher_stops_a_sagemaker_job_and_never_resubmits(aws: SageMakerFront,
                                                               project: Path, ct_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """StopTrainingJob (SIGTERM, then 120 s: the nodes save) once the budget is spent; nothing is created again."""
    run = Job(script="train_ddp.py", source_dir=str(project), nodes=2, accelerator="A10G:4", spot=True,
              max_cost=20, max_restarts=3).submit("aws")
    job = run.handle.job_id
    record = cost.recorded(str(run.handle))
    assert record and record["max_cost"] == 20 and record["rate"]["instance_type"] == "ml.g5.12xlarge"
    aws.set_status(job, "InProgress", "Training")
    started = run.provider.describe(run.handle).started_at or run.provider.describe(run.handle).created_at
    assert started is not None
    hourly = cost.rate_from(record).hourly  # type: ignore[union-attr]
    monkeypatch.setattr(cost, "clock", lambda: started + 3600 * 20 / hourly + 60)  # a minute past the budget
    status = run.wait(timeout=60, poll=0.05, recover=True, progress=False)
    assert aws.stop_requests == [job] and aws.calls.count("CreateTrainingJob") == 1
    assert status.state is JobState.CANCELLED and "stopped: budget USD 20.00" in status.recovery["budget"]
    assert "stopped: budget USD 20.00" in run.status().message
    # a watcher started later does not resubmit either, though the job asked for restarts
    aws.set_status(job, "Failed", "Interrupted")  # as if it had ended preempted
    again = recovery.wait_with_recovery(run.provider, run.handle, poll=0.05, log=lambda _m: None)
    assert aws.calls.count("CreateTrainingJob") == 1 and again.recovery["budget"].startswith("stopped: budget")


def test_budget_spans_every_leg_of_a_recovery_chain(ct_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Legs already ended count: the second leg is stopped when legs one and two together reach max_cost."""
    rate = cost.Rate("gcp", "a2-highgpu-8g", 1, "spot", on_demand=40.0, spot=10.0)
    cost.write("gcp://p/r/1", {"handle": "gcp://p/r/1", "rate": rate.to_dict(), "max_cost": 25.0})
    recovery.save(recovery.RecoveryState(root="gcp://p/r/1", max_restarts=3, chain=["gcp://p/r/1", "gcp://p/r/2"]))
    from cloudtrain.job_types import JobStatus

    def status(job: str, started: float, ended: float | None) -> JobStatus:
        state = JobState.PREEMPTED if ended else JobState.RUNNING
        return JobStatus(JobHandle.parse(f"gcp://p/r/{job}"), job, state, started_at=started, ended_at=ended)

    monkeypatch.setattr(budget, "_describe", lambda handle: status("1", 0.0, 2 * 3600.0))  # leg one: $20
    cancelled: list[str] = []

    class Provider:
        def cancel(self, handle: JobHandle) -> None:
            cancelled.append(str(handle))

    watcher = budget.watcher(chain_of("gcp://p/r/2"), log=lambda _m: None)
    assert watcher is not None
    monkeypatch.setattr(cost, "clock", lambda: 10_000.0 + 3600 * 0.4)  # leg two: $4 -> $24 in all
    watcher.poll(Provider(), status("2", 10_000.0, None))  # type: ignore[arg-type]
    assert not cancelled
    monkeypatch.setattr(cost, "clock", lambda: 10_000.0 + 3600 * 0.6)  # leg two: $6 -> $26 in all
    watcher.poll(Provider(), status("2", 10_000.0, None))  # type: ignore[arg-type]
    watcher.poll(Provider(), status("2", 10_000.0, None))  # type: ignore[arg-type]
    assert cancelled == ["gcp://p/r/2"]  # asked once
    assert "2 leg(s), 1 restart(s), USD 26.00" in (budget_note("gcp://p/r/1") or "")


def test_cost_of_a_job_without_a_price_says_so(cli, project: Path, ct_home: Path) -> None:
    handle = cli("submit", str(project / "train_ddp.py"), "--detach", "--", "--epochs", "1").stdout.strip()
    cli("wait", handle, timeout=240)
    shown = cli("cost", handle)
    assert shown.returncode == 0 and f"no price known for {handle}" in shown.stdout, shown.stdout + shown.stderr
    assert json.loads(cli("cost", handle, "-o", "json").stdout)["unpriced"] == [handle]


_OTHER_SHAPES = [
    {"handle": "x", "rate": {"provider": "local", "price": 3}, "max_cost": None},  # another version's rate
    {"rate": {"provider": "local", "instance_type": "m", "nodes": "2", "capacity": "on_demand", "on_demand": 3}},
    {"rate": {"provider": "local", "instance_type": "m", "nodes": 1, "capacity": "on_demand", "on_demand": "3"}},
    {"rate": [1]}, {"max_cost": "5"}, {"stopped": 5}, [1],
]


def test_a_cost_record_of_another_shape_is_named_and_the_rest_shown(cli, project: Path, ct_home: Path) -> None:
    """Issue 38.15: a cost record in the home of another shape (another version's, edited by hand) ended `cloudtrain
    cost` (and `status`: the budget note) in TypeError. It is named with what is wrong and the fix, not used, and the
    chain's other legs are still priced."""
    flags = ["--detach", "--set", "providers.local.price_per_node_hour=36", "--max-cost", "100", "--", "--epochs", "1"]
    first, second = (cli("submit", str(project / "train_ddp.py"), *flags).stdout.strip() for _ in range(2))
    for handle in (first, second):
        assert cli("wait", handle).returncode == 0
    recovery.save(recovery.RecoveryState(root=first, max_restarts=3, chain=[first, second]))
    root, later = cost._path(first), cost._path(second)
    kept = root.read_text()

    def named(record: Path, *args: str) -> subprocess.CompletedProcess[str]:
        shown = cli(*args)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, (record.read_text(), shown.stderr)
        assert f"cloudtrain: warning: the cost record {record} " in shown.stderr, (record.read_text(), shown.stderr)
        assert f"fix: delete {record}" in shown.stderr, shown.stderr
        return shown

    for shape in [*_OTHER_SHAPES, "not json"]:
        text = shape if isinstance(shape, str) else json.dumps(shape)
        later.write_text(text)  # a later leg's record: the others, and the root's budget, still count
        priced = json.loads(named(later, "cost", second, "-o", "json").stdout)
        assert [leg["handle"] for leg in priced["legs"]] == [first, second] and priced["max_cost"] == 100, priced
        assert priced["legs"][0]["per_node_hour"] == 36 and str(later) in priced["problems"][0], priced
        assert "1 cost record(s) not used" in named(later, "cost", second).stdout
        root.write_text(text)  # the root's: status reads its budget note
        named(root, "status", second)
        assert [leg["handle"] for leg in json.loads(named(root, "cost", first, "-o", "json").stdout)["legs"]] == [
            first, second]
        root.write_text(kept)


def test_sdk_run_accepts_max_cost_as_a_spec_field(project: Path) -> None:
    with pytest.raises(Exception, match="max_cost"):
        Job(script="train_ddp.py", source_dir=str(project), max_cost=-1)
    assert Job(script="train_ddp.py", source_dir=str(project), max_cost="$1,000").spec.max_cost == 1000


def test_the_plan_caps_max_runtime_at_what_the_budget_buys(cli, project: Path) -> None:
    """A detached job nothing watches ran past max_cost until its 24h max_runtime: the plan caps max_runtime at what
    the budget buys (plus a margin in which a watcher stops the job first), and the platform's own request holds it
    (Vertex's scheduling.timeout here). A shorter max_runtime is left as it is."""
    flags = ["-p", "gcp", "--gpus", "A100:8", "--nodes", "2", "--spot", "--max-cost", "$100"]
    planned = json.loads(cli("plan", str(project / "train_ddp.py"), *flags, "-o", "json").stdout)
    bought = 100 / 23.09 * 3600  # spot, billed: 4h19m52s
    cap = planned["budget"]["runtime_cap"]
    assert bought + cost.BACKSTOP_MARGIN < cap < bought * 1.01 + 5  # 1 % past it, at least BACKSTOP_MARGIN s
    assert planned["spec"]["max_runtime"] == cap
    assert planned["request"]["customJob"]["jobSpec"]["scheduling"]["timeout"] == f"{cap}s"
    text = cli("plan", str(project / "train_ddp.py"), *flags).stdout
    assert "max_runtime is capped at 4h22m29s, so the platform stops it even when nothing watches it" in text, text
    short = json.loads(cli("plan", str(project / "train_ddp.py"), *flags, "--max-runtime", "2h", "-o", "json").stdout)
    assert short["spec"]["max_runtime"] == 7200 and "runtime_cap" not in short["budget"]


@pytest.mark.slow
def test_a_detached_job_nothing_watches_stops_at_its_budget(cli, project: Path, tmp_path: Path) -> None:
    """$1 at the rehearsal price buys 20 s; nothing watches the job (a plain `wait`), yet it stops at its capped
    max_runtime (20 s and a 30 s margin), with a final checkpoint, and says the budget is why."""
    handle = cli("submit", str(project / "train_ddp.py"), "--procs-per-node", "2", "--checkpoint-uri",
                 (tmp_path / "ckpt").as_uri(), *SLOW_PRICE, "--max-cost", "1", "--detach", *SLOW_TRAIN).stdout.strip()
    waited = cli("wait", handle, "-o", "json", timeout=300)
    final = json.loads(waited.stdout)
    assert waited.returncode == 1 and final["state"] == "failed", waited.stdout[-3000:]
    assert final["message"].startswith("budget USD 1.00 spent: max_runtime 50s exceeded: stopped after"), final
    logs = cli("logs", handle).stdout
    assert "stop requested: final checkpoint at step" in logs, logs[-3000:]
