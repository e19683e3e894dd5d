"""`plan --compare`: one job planned on every installed provider (and each region asked for), offline, as rows sorted
by cost; `submit --provider cheapest` submits the first row that can run.

The source is packaged once and every provider plans in this process (a provider's plan imports its SDK only where
its own validation needs it). A provider that cannot plan the job (a capability it lacks, no such GPU in its
catalog, a budget below an hour of its price, not installed) is a row saying why, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain import registry
from cloudtrain.errors import UserError

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.plan.model import Plan
    from cloudtrain.spec.model import JobSpec

CHEAPEST = "cheapest"  # what --provider takes to submit to the first row that can run


@dataclass
class Row:
    """One provider (and region) for the job: its machine and prices, or why it cannot run the job."""

    provider: str
    region: str | None = None
    instance: str | None = None
    gpus: str | None = None  # per node, e.g. "8 x A100"
    nodes: int = 1
    on_demand: float | None = None  # USD per hour, all nodes
    spot: float | None = None
    billed_as: str | None = None  # "on_demand", "spot", "flex_start"
    estimate: float | None = None  # USD for max_runtime at the billed rate
    missing: list[str] = field(default_factory=list)  # settings to set before submit can send it
    reason: str | None = None  # why it cannot be planned (None: planned)
    plan: Plan | None = field(default=None, repr=False)

    @property
    def hourly(self) -> float | None:
        """The billed rate (spot where spot has a price and the job asks for it)."""
        if self.billed_as == "spot" and self.spot is not None:
            return self.spot
        return self.on_demand

    @property
    def ready(self) -> bool:
        """Planned, and nothing to set before submitting."""
        return self.reason is None and not self.missing

    @property
    def status(self) -> str:
        if self.reason:
            return f"cannot run: {self.reason}"
        if self.missing:
            return "set " + ", ".join(self.missing)
        return "ready"

    def sort_key(self) -> tuple[Any, ...]:
        return (self.reason is not None, self.hourly is None, self.hourly or 0.0, bool(self.missing), self.provider,
                self.region or "")

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "region": self.region, "instance": self.instance, "gpus": self.gpus,
                "nodes": self.nodes, "on_demand_hourly": self.on_demand, "spot_hourly": self.spot,
                "billed_as": self.billed_as, "hourly": self.hourly, "estimate": self.estimate, "ready": self.ready,
                "missing": self.missing, "reason": self.reason}


class Comparison:
    """The rows, cheapest first; holds the shared package and every plan until closed (``with``)."""

    def __init__(self, rows: list[Row], package: Package | None, spec: JobSpec) -> None:
        self.rows = sorted(rows, key=Row.sort_key)
        self.package = package
        self.spec = spec
        self._taken: list[Row] = []

    def __enter__(self) -> Comparison:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Every plan's package, but a taken plan's (it is being submitted; its own ``with`` closes it)."""
        kept = {id(row.plan.package) for row in self._taken if row.plan is not None}
        packages = [row.plan.package for row in self.rows if row.plan is not None]
        for package in {id(p): p for p in [*packages, *([self.package] if self.package else [])]}.values():
            if id(package) not in kept:
                package.close()

    def take(self, row: Row) -> Plan:
        """The row's plan, left open by ``close`` (for submit)."""
        assert row.plan is not None
        self._taken.append(row)
        return row.plan

    def cheapest(self) -> Row:
        """The first row that can run with a list price; else a UserError saying what each needs."""
        for row in self.rows:
            if row.ready and row.hourly is not None:
                return row
        shown = "; ".join(f"{r.provider}{'/' + r.region if r.region else ''}: "
                          + (r.status if r.hourly is not None or r.reason else "no list price") for r in self.rows)
        raise UserError(f"no provider with a list price can run this job as it is ({shown})", field="--provider",
                        remedy="set what a row needs (`cloudtrain plan --compare` lists them), or name a provider")

    def to_dict(self) -> dict[str, Any]:
        return {"max_runtime_hours": round(self.spec.max_runtime / 3600, 3), "currency": "USD",
                "max_cost": self.spec.max_cost, "rows": [r.to_dict() for r in self.rows],
                "basis": "list prices in one reference region per provider (`cloudtrain catalog`): estimates, "
                         "compute only"}


def compare(spec: JobSpec, providers: list[str] | None = None, regions: dict[str, list[str]] | None = None,
            spec_file: str | None = None) -> Comparison:
    """Plan ``spec`` on each provider (default: every registered one), once per region asked for (default: the
    configured one). Offline: nothing is staged or sent."""
    from cloudtrain.plan.planner import _package
    from cloudtrain.spec.model import check_local_paths

    names = providers or registry.names()
    unknown = [p for p in (regions or {}) if p not in names]
    if unknown:
        raise UserError(f"--region names {', '.join(unknown)}, which is not compared", field="--region",
                        remedy=f"use PROVIDER=REGION[,REGION] with one of: {', '.join(names)}")
    package = _package(spec, check_local_paths(spec), False, {})
    rows: list[Row] = []
    try:
        for name in names:
            wanted: list[str | None] = [*(regions or {}).get(name, [])] or [None]
            for region in wanted:
                rows.append(_row(spec, name, region, package, spec_file))
    except BaseException:
        Comparison(rows, package, spec).close()
        raise
    return Comparison(rows, package, spec)


def _row(spec: JobSpec, name: str, region: str | None, package: Package, spec_file: str | None) -> Row:
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.plan.export import unset_settings
    from cloudtrain.plan.planner import plan_job
    from cloudtrain.providers import get_provider

    row = Row(provider=name, region=region, nodes=spec.nodes)
    unset_region = f"providers.{name}.region"
    try:
        impl = get_provider(name)
        if region is not None:
            spec = _in_region(spec, name, region)
        try:
            plan = plan_job(spec, impl, progress=False, spec_file=spec_file, package=package)
        except CloudtrainError as exc:
            if region is not None or exc.field != unset_region or not impl.declaration.catalog:
                raise
            # no region configured (AWS plans need one): price it in the catalog's region, and say what to set
            from cloudtrain.platforms.catalog import price_source

            row.missing.append(unset_region)
            plan = plan_job(_in_region(spec, name, price_source(name).region), impl, progress=False,
                            spec_file=spec_file, package=package)
    except CloudtrainError as exc:  # this provider cannot plan the job: the row says why
        row.reason = exc.message.removeprefix(f"{exc.field}: ") if exc.field else exc.message
        if exc.field and exc.field not in row.reason:
            row.reason = f"{exc.field}: {row.reason}"
        return row
    row.plan = plan
    row.region = plan.staging.get("region") or region
    machine = plan.machine
    if machine is not None:
        row.instance = machine.instance_type
        row.gpus = f"{machine.gpus} x {machine.gpu}" if machine.gpu else "no GPU"
    est = plan.estimate or {}
    if est.get("available"):
        row.billed_as = est["billed_as"]
        row.on_demand = est["on_demand"]["hourly"]
        row.spot = (est.get("spot") or {}).get("hourly")
    else:  # a price the provider's options give (providers.local.price_per_node_hour), or none
        from cloudtrain.plan.cost import rate_of

        rate = rate_of(plan)
        if rate is not None and rate.hourly is not None:
            row.instance = row.instance or rate.instance_type
            row.billed_as, row.on_demand = rate.capacity, rate.hourly
            row.spot = rate.hourly if rate.spot is not None else None
    if row.hourly is not None:
        row.estimate = round(row.hourly * spec.max_runtime / 3600, 2)
    row.missing += unset_settings(plan)
    for note in plan.notes:  # a setting a provider plans without but cannot submit without (Azure's workspace)
        said = note.removeprefix(f"{name}: ").partition(" not set")[0]
        if note.startswith(f"{name}: ") and " not set" in note and not any(m.rsplit(".", 1)[1] in said
                                                                           for m in row.missing):
            row.missing.append(said)
    return row


def _in_region(spec: JobSpec, provider: str, region: str) -> JobSpec:
    from cloudtrain.spec.model import apply_overrides, options_model, validate_spec

    if "region" not in options_model(provider).model_fields:
        raise UserError(f"{provider} has no region setting", field="--region",
                        remedy=f"leave {provider} out of --region (its region comes with its workspace or cluster)")
    return validate_spec(apply_overrides(spec.model_dump(exclude_unset=True), {f"providers.{provider}.region": region}))
