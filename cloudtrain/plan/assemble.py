"""The core assembles every plan; a provider translates it (issue 39.1). ``assemble`` resolves the provider's
context once, asks the provider for its translation (``Provider._translate``), and builds the Plan with what every
plan shares: the job name's platform rule, one process per GPU at most, the torch note, the catalog's estimate.
(The planner, cloudtrain/plan/planner.py, adds the budget and the package's notes.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cloudtrain.errors import SpecError
from cloudtrain.naming import check_job_name
from cloudtrain.plan.model import Plan
from cloudtrain.providers.translation import PlanContext

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.providers.base import Provider
    from cloudtrain.spec.model import JobSpec


def context(impl: Provider, spec: JobSpec, package: Package) -> PlanContext:
    """The one context of a plan for ``impl``: ``spec`` already has its settings filled (planner.plan_job), and a
    setting the provider asks for beyond them is resolved here, once, with the platform's own tools."""
    from cloudtrain.spec.settings import placeholder_note, resolve

    options = spec.providers.held(impl.name)

    def resolved(key: str) -> tuple[Any, str, str]:
        found = resolve(impl.name, key, spec=getattr(options, key, None))
        return found.value, found.source, placeholder_note(impl.name, key)

    return PlanContext(provider=impl.name, spec=spec, package=package, contract=impl.contract(spec), resolve=resolved)


def assemble(impl: Provider, spec: JobSpec, package: Package) -> Plan:
    """The plan of ``spec`` on ``impl``: its translation, made a Plan, checked, with the torch note and estimate."""
    impl._check_capabilities(spec)
    from pydantic import ValidationError

    try:
        plan = _translated(impl, spec, package)
    except ValidationError as exc:  # a location the provider derives from its settings that the spec refuses
        raise _derived_error(impl.name, exc) from None
    decl = impl.declaration
    check_job_name(impl.name, plan.job_id, decl.name_pattern, decl.name_rule)
    _check_processes(plan)
    from cloudtrain.platforms.images import runtime_note, torch_note

    differs = torch_note(impl.name, plan.runtime, plan.spec)  # what a local try-out runs, against the nodes
    too_old = runtime_note(impl.name, plan.runtime)
    plan.notes += [note for note in (differs, too_old) if note]
    if decl.catalog:  # a provider that lists prices (a local job costs this computer's time)
        from cloudtrain.platforms.catalog import estimate

        plan.estimate = estimate(plan.machine, spec.nodes, impl._capacity(spec), spec.max_runtime,
                                 plan.staging.get("region"))
    return plan


def _translated(impl: Provider, spec: JobSpec, package: Package) -> Plan:
    if not impl.translates():  # a plugin written before the translation hook composes its Plan itself
        plan = impl._plan(spec, package)
        assert isinstance(plan, Plan), f"{type(impl).__name__}._plan returned {type(plan).__name__}, not a Plan"
        return plan
    done = impl._translate(context(impl, spec, package))
    return Plan(provider=impl.name, job_id=done.job_id, spec=done.spec, package=package, request=done.request,
                nodes=done.nodes, staging=done.staging, notes=done.notes, machine=done.machine, image=done.image,
                runtime=done.runtime, estimate=done.estimate)


def _derived_error(provider: str, exc: Any) -> SpecError:
    """A value the provider set on the spec while planning (output_uri or checkpoint.uri under its staging location)
    that the spec's own checks refuse: named with the settings it came from, not as a traceback."""
    from cloudtrain.spec.messages import friendly_error

    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "the spec"
    return SpecError(f"{where} as {provider} derives it from its settings is not usable: {friendly_error(err)}",
                     field=f"providers.{provider}",
                     remedy=f"correct providers.{provider}'s storage setting (its staging location or bucket), or "
                            f"set {where} yourself")


def _check_processes(plan: Plan) -> None:
    """One process per GPU at most (NCCL cannot share a device between ranks); fewer is allowed, and said."""
    machine, procs = plan.machine, plan.spec.procs_per_node
    if machine is None or not machine.gpus or not isinstance(procs, int):
        return
    if procs > machine.gpus:
        raise SpecError(f"{procs} processes per node, but {machine.instance_type} has {machine.gpus} GPU(s)",
                        field="procs_per_node",
                        remedy=f"set procs_per_node to at most {machine.gpus} (or 'auto': one per GPU), or pick "
                               "a larger accelerator")
    if procs < machine.gpus:
        plan.notes.append(f"{plan.provider}: {procs} process(es) per node use {procs} of the "
                          f"{machine.gpus} GPUs of {machine.instance_type}")
