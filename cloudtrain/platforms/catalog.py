"""The accelerator catalog: which machine each provider runs a spec's ``accelerator`` ("A100:8") on, what it holds
(GPU model, count, memory) and what it costs by the hour, read from ``data/catalog.json``; no SDK needed.

A spec names GPUs (model and count per node), the way users think of them; each platform sells them as instance
types (SageMaker ``ml.*``, Azure VM sizes, Vertex machine type + accelerator). An explicit instance type in the
spec always wins over this table. Prices are list prices in one reference region per provider, dated and sourced in
the data file: estimates to read before paying, never a bill. Each provider ships its own rows (``catalog.json`` in
its folder, declared in its registry entry).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

from cloudtrain import registry
from cloudtrain.errors import SpecError


@dataclass(frozen=True)
class Machine:
    """One node's machine on one provider (for Vertex: a machine type with its attached accelerators)."""

    provider: str
    instance_type: str
    gpu: str | None  # the model as a spec names it ("A100-80GB"); None: a CPU machine
    gpus: int
    gpu_memory_gb: float | None = None  # per GPU
    vcpus: int | None = None
    memory_gb: float | None = None
    on_demand: float | None = None  # USD per node-hour, list price in the catalog's region; None: not known
    spot: float | None = None  # USD per node-hour on spot/low-priority capacity; None: not published
    accelerator_type: str | None = None  # Vertex's AcceleratorType enum value
    confidence: str | None = None  # "sourced" (read from a price list) or "recalled" (a known figure, less sure)
    cpu_default: bool = False  # the machine a job without accelerators gets

    @property
    def accelerator(self) -> str:
        return f"{self.gpu}:{self.gpus}" if self.gpu else "-"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "cpu_default"}


@dataclass(frozen=True)
class PriceSource:
    """Where a provider's prices come from: region, date and page, and how spot is billed there."""

    provider: str
    region: str
    as_of: str
    source: str
    spot_note: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def providers() -> list[str]:
    """The providers that ship catalog rows (every registered one that declares a catalog)."""
    return [name for name, decl in registry.declarations().items() if decl.catalog]


@functools.cache
def _data(provider: str) -> dict[str, Any]:
    decl = registry.declaration(provider) if registry.exists(provider) else None
    if decl is None or not decl.catalog:
        known = providers()
        raise SpecError(f"the catalog covers {', '.join(known)}, not {provider!r}", field="--provider",
                        remedy=f"use one of {', '.join(known)} (a local job runs on this machine)")
    return dict(decl.data("catalog"))


@functools.cache
def machines(provider: str) -> tuple[Machine, ...]:
    return tuple(Machine(provider=provider, **row) for row in _data(provider)["machines"])


def price_source(provider: str) -> PriceSource:
    meta = _data(provider)
    return PriceSource(provider, meta["region"], meta["as_of"], meta["source"], meta["spot_note"])


def parse_accelerator(text: str) -> tuple[str, int]:
    """``"a100:8"`` -> ``("A100", 8)``; a bare model means one GPU."""
    model, colon, count = text.partition(":")
    if not model or (colon and not (count.isdigit() and int(count) > 0)):  # "A100:", "A100:0", "A100:00"
        raise SpecError(f"{text!r} is not MODEL or MODEL:COUNT", field="--gpus", remedy="write e.g. --gpus A100:8")
    return model.upper(), int(count or 1)


def find(provider: str, instance_type: str, accelerator_type: str | None = None,
         accelerator_count: int | None = None) -> Machine | None:
    """The catalog's entry for a machine a plan chose (None: a type cloudtrain has no data for)."""
    # rows that name an accelerator type: one machine type comes with several accelerator choices (Vertex's N1)
    typed = any(m.accelerator_type for m in machines(provider))
    for machine in machines(provider):
        if machine.instance_type != instance_type:
            continue
        if typed and (machine.accelerator_type, machine.gpus) != (accelerator_type, accelerator_count or 0):
            continue
        return machine
    return None


# A spec's "A100" is satisfied by the 80 GB part where a provider sells only that one at a given count
# (Azure's NC A100 v4 sizes).
_LARGER = {"A100": "A100-80GB"}


def _wanted(model: str) -> tuple[str, ...]:
    """The GPU models that satisfy ``model``, preferred first (never None: that would match the CPU rows)."""
    larger = _LARGER.get(model)
    return (model, larger) if larger else (model,)


def lookup(provider: str, model: str | None, count: int) -> Machine | None:
    """The machine for ``count`` x ``model`` GPUs per node (no model: the CPU default)."""
    if model is None:
        return next(m for m in machines(provider) if m.cpu_default)
    for wanted in _wanted(model):
        found = next((m for m in machines(provider) if (m.gpu, m.gpus) == (wanted, count)), None)
        if found:
            return found
    return None


def machine_of(provider: str, instance_type: str, gpu: str | None, gpus: int,
               accelerator_type: str | None = None) -> Machine:
    """The catalog's entry for the machine a plan chose, else what the spec says of it (GPUs, no prices): an
    explicit instance type cloudtrain has no data for still gets its GPU count checked and a plan summary."""
    found = find(provider, instance_type, accelerator_type, gpus)
    if found:
        return found
    if gpu is None and accelerator_type:  # an explicit Vertex machine_type + accelerator_type: name its GPUs
        gpu = next((m.gpu for m in machines(provider) if m.accelerator_type == accelerator_type), None)
    return Machine(provider, instance_type, gpu, gpus, accelerator_type=accelerator_type)


def offered(provider: str, model: str) -> list[int]:
    return sorted({m.gpus for m in machines(provider) if m.gpu in _wanted(model)})


def unknown_accelerator(provider: str, model: str, count: int) -> SpecError:
    """The error for a GPU model and count the provider's table has no machine for, listing what it has."""
    counts = offered(provider, model)
    if counts:
        hint = f"{model} comes {', '.join(f'{model}:{c}' for c in counts)} per node on {provider}"
    else:
        models = sorted({m.gpu for m in machines(provider) if m.gpu})
        hint = f"known GPU models on {provider}: {', '.join(models)}"
    return SpecError(f"no {provider} machine with {count} x {model} ({hint})", field="accelerator",
                     remedy=f"pick one of those (`cloudtrain catalog --provider {provider}`), or set "
                            f"{registry.declaration(provider).instance_option or 'the machine type'} explicitly")


def instance_for(provider: str, model: str | None, count: int, explicit: str | None) -> str:
    """The instance type for ``count`` x ``model`` GPUs per node (``explicit`` wins; no GPU: a CPU default)."""
    if explicit:
        return explicit
    found = lookup(provider, model, count)
    if found is None:
        raise unknown_accelerator(provider, str(model), count)
    return found.instance_type


def search(provider: str | None = None, accelerator: str | None = None) -> list[Machine]:
    """Catalog rows, filtered by provider and by ``MODEL`` or ``MODEL:COUNT``: the machines a spec's
    ``accelerator`` can get, so a count served only by the larger part (Azure's ``A100:1``) lists that part."""
    chosen = [provider] if provider else providers()
    if not accelerator:
        return [m for p in chosen for m in machines(p)]
    model, count = parse_accelerator(accelerator)
    exact = ":" in accelerator
    rows = []
    for p in chosen:  # per count, the machine a plan would pick (lookup), in the table's order
        picked = {lookup(p, model, n) for n in offered(p, model) if not exact or n == count}
        rows += [m for m in machines(p) if m in picked]
    return rows


def estimate(machine: Machine | None, nodes: int, capacity: str, max_runtime_s: int,
             region: str | None = None) -> dict[str, Any]:
    """What the job may cost from list prices: per hour and for the whole ``max_runtime``, on-demand and spot.
    ``capacity`` is how the job will be billed: ``on_demand``, ``spot`` or ``flex_start`` (Vertex).

    Always an estimate: one reference region, compute only (no storage, egress or logging), and a job is billed for
    the time it runs, which max_runtime only bounds."""
    if machine is None or machine.on_demand is None:
        what = machine.instance_type if machine else "this machine"
        return {"available": False, "billed_as": capacity,
                "reason": f"cloudtrain's catalog has no price for {what} (`cloudtrain catalog` lists those it has)"}
    source = price_source(machine.provider)
    hours = max_runtime_s / 3600

    def priced(per_node: float | None) -> dict[str, float] | None:
        if per_node is None:
            return None
        return {"per_node_hour": round(per_node, 4), "hourly": round(per_node * nodes, 2),
                "max_runtime": round(per_node * nodes * hours, 2)}

    result: dict[str, Any] = {
        "available": True,
        "currency": "USD",
        "instance_type": machine.instance_type,
        "nodes": nodes,
        "max_runtime_hours": round(hours, 3),
        "billed_as": capacity,
        "on_demand": priced(machine.on_demand),
        "spot": priced(machine.spot),
        "price_region": source.region,
        "as_of": source.as_of,
        "source": source.source,
        "basis": "estimate from list prices: compute only (no storage, egress or logs); a job is billed for the "
                 "time it runs, which max_runtime bounds",
    }
    if machine.spot is None:
        result["spot_note"] = source.spot_note
    if capacity == "flex_start":
        result["capacity_note"] = "flex-start (Dynamic Workload Scheduler) has its own discounted prices, not in " \
                                  "the catalog; on-demand is the upper bound"
    if region and region != source.region:
        result["region_note"] = f"prices are {source.region} list prices; {region} may differ"
    return result
