"""Ordered fallback (``provider: [aws, gcp, azure]``, ``-p aws,gcp``, ``providers.<name>.regions``): the legs a job
may run on, in order; a plan for each; a submit that moves on when a platform refuses for capacity or quota (each
provider says which of its errors mean that: ``Provider.capacity_error``) or when a leg's provider is not installed
here (its extra missing: the plan names it with its ``pip install``, a submit skips it, saying so; only when no leg
can run is that an error, exit 2, naming each leg and its fix); and the move of a running job whose
capacity is gone to the next leg, its newest verified checkpoint carried store to store (cloudtrain.checkpoint.copy)
unless the new leg reaches the store it is in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain import registry
from cloudtrain.errors import CloudtrainError, ProviderNotInstalled, SpecError

if TYPE_CHECKING:
    from cloudtrain.handles import JobHandle
    from cloudtrain.job_types import JobStatus
    from cloudtrain.plan.model import Plan
    from cloudtrain.providers.base import Provider
    from cloudtrain.spec.model import JobSpec

Log = Callable[[str], None]
_CLOUD_SCHEMES = ("s3", "gs", "az")  # a store only its own cloud's nodes reach without other credentials


@dataclass(frozen=True)
class Leg:
    provider: str
    region: str | None = None

    def label(self) -> str:
        return f"{self.provider} {self.region}" if self.region else self.provider

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "region": self.region}


@dataclass(frozen=True)
class Unusable:
    """A leg this machine cannot plan or submit: its provider's extra is not installed ``where`` ("here"; for a
    saved plan's leg with no plan in it, where that plan was made). A submit skips it and tries the next leg."""

    leg: Leg
    message: str  # provider 'aws' needs boto3, which is not installed
    remedy: str  # pip install 'cloudtrain[aws]'
    where: str = "here"

    @classmethod
    def of(cls, leg: Leg, error: ProviderNotInstalled, where: str = "here") -> Unusable:
        return cls(leg, error.message, error.remedy or "", where)

    def why(self) -> str:
        return f"not installed {self.where}" + (f" ({self.remedy})" if self.remedy else "")

    def to_dict(self) -> dict[str, Any]:
        return {**self.leg.to_dict(), "not_installed": {"message": self.message, "remedy": self.remedy}}


class Skip(Exception):
    """Raised by an attempt of ``try_legs``: the leg cannot run here (``unusable``); the next one is tried."""

    def __init__(self, unusable: Unusable) -> None:
        super().__init__(unusable.why())
        self.unusable = unusable


def none_usable(unusable: list[Unusable]) -> ProviderNotInstalled:
    """The error when no leg of a fallback list can run here (exit 2): each leg and its fix."""
    fixes = list(dict.fromkeys(u.remedy for u in unusable if u.remedy))
    return ProviderNotInstalled("no provider of the fallback list can run here: "
                                + "; ".join(f"{u.leg.label()}: {u.why()}" for u in unusable), field="--provider",
                                remedy=" or ".join(fixes) if fixes else "install a provider of the list")


def provider_names(spec: JobSpec, flag: str | None) -> tuple[list[str], str]:
    """The providers in order, and where they were given: ``-p aws,gcp`` wins over the spec's ``provider``;
    neither: local."""
    if flag is not None:  # `-p ""` or `-p ,` names no provider: refused below, never read as "local"
        return [name.strip() for name in flag.split(",")] if flag.strip(", ") else [flag], "--provider"
    given = spec.provider
    if given is None:
        return ["local"], "provider"
    return ([given] if isinstance(given, str) else list(given)), "provider"


def legs_of(spec: JobSpec, names: list[str], field: str = "provider") -> list[Leg]:
    """Each provider once per region it lists (``providers.<name>.regions``), else once. Unknown names and
    repeated ones are refused (exit 2), naming the field."""
    known = registry.names()
    for name in names:
        if not registry.exists(name):
            raise SpecError(f"unknown provider {name!r}" + (" in the fallback list" if len(names) > 1 else ""),
                            field=field, remedy=f"use names from: {', '.join(known)}")
    if len(set(names)) != len(names):
        raise SpecError(f"a provider is listed twice: {', '.join(names)}", field=field,
                        remedy="list each provider once; several regions go in providers.<name>.regions")
    legs = []
    for name in names:
        block = spec.providers.held(name) if len(names) > 1 else None
        regions = list(getattr(block, "regions", None) or []) if block is not None else []
        legs += [Leg(name, region) for region in regions] or [Leg(name)]
    return legs


def leg_spec(spec: JobSpec, leg: Leg, checkpoint_uri: str | None = None) -> JobSpec:
    """The spec as leg ``leg`` runs it: its region, and the store it resumes from (when the job moved)."""
    if leg.region is None and checkpoint_uri is None:
        return spec
    from cloudtrain.spec.model import apply_overrides, validate_spec

    raw = spec.model_dump(mode="json", exclude_unset=True)
    return validate_spec(apply_overrides(raw, {f"providers.{leg.provider}.region": leg.region,
                                               "checkpoint.uri": checkpoint_uri}))


@contextmanager
def plan_legs(spec: JobSpec, legs: list[Leg], spec_file: str | None = None) -> Iterator[list[Plan | Unusable]]:
    """A plan per leg, in order. With more than one leg, a leg whose settings are missing is refused now (exit 2):
    a fallback that cannot submit would fail only when it is needed; a leg whose provider is not installed here is
    an ``Unusable`` in its place (a submit here skips it), unless no leg can run (exit 2, each named)."""
    from cloudtrain.plan.export import unset_settings
    from cloudtrain.plan.planner import plan_job

    with ExitStack() as stack:
        plans: list[Plan | Unusable] = []
        for leg in legs:
            try:
                plan = stack.enter_context(plan_job(leg_spec(spec, leg), leg.provider, spec_file=spec_file))
            except ProviderNotInstalled as exc:
                if len(legs) == 1:  # one provider: not installed is the error it always was
                    raise
                plans.append(Unusable.of(leg, exc))
                continue
            missing = unset_settings(plan) if len(legs) > 1 else []
            if missing:
                raise SpecError(f"is not set, and the fallback list names {leg.label()}", field=missing[0],
                                remedy=f"set {missing[0]} in the spec (or --set {missing[0]}=...), or "
                                       f"`cloudtrain config set {missing[0].removeprefix('providers.')} ...`, or "
                                       f"take {leg.provider} out of the list")
            plans.append(plan)
        if all(isinstance(plan, Unusable) for plan in plans):
            raise none_usable([plan for plan in plans if isinstance(plan, Unusable)])
        yield plans


def submit_first(spec: JobSpec, legs: list[Leg], spec_file: str | None = None, start: int = 0,
                 log: Log = print) -> tuple[Provider, JobHandle, int, list[str]]:
    """Submit on the first leg (from ``start``) that takes the job: a refusal for capacity or quota, or a provider
    not installed here, moves on to the next; any other error is raised. Returns the provider, the handle, the leg
    and why earlier legs refused (or were skipped)."""
    from cloudtrain.plan.planner import plan_job
    from cloudtrain.providers import get_provider

    def attempt(leg: Leg) -> tuple[Provider, JobHandle]:
        provider = get_provider(leg.provider)
        with plan_job(leg_spec(spec, leg), provider, spec_file=spec_file) as plan:
            try:
                return provider, provider.submit(plan)
            except CloudtrainError as exc:
                raise Refused(provider, exc) from exc

    return try_legs(legs, attempt, start, log)


class Refused(Exception):
    """A leg's submit failed: the provider that refused and its error (whether for capacity, it decides)."""

    def __init__(self, provider: Provider, error: CloudtrainError) -> None:
        super().__init__(str(error))
        self.provider, self.error = provider, error


def try_legs(legs: list[Leg], attempt: Callable[[Leg], tuple[Provider, JobHandle]], start: int = 0,
             log: Log = print) -> tuple[Provider, JobHandle, int, list[str]]:
    """The decision of ``submit_first``, on any ``attempt`` (benchmarks/goodput.py replays it on fake providers):
    the first leg that takes the job; one that refuses for capacity (``Provider.capacity_error``) moves it on, and
    so does one whose provider is not installed here (``ProviderNotInstalled``, or ``Skip`` from the attempt). No leg
    tried: exit 2 when none could run here, naming each leg and its fix."""
    refused: list[str] = []
    skipped: list[Unusable] = []
    for index in range(start, len(legs)):
        leg = legs[index]
        following = f"; trying {legs[index + 1].label()}" if index + 1 < len(legs) else ""
        try:
            provider, handle = attempt(leg)
            return provider, handle, index, refused
        except (Skip, ProviderNotInstalled, Refused) as exc:
            missing = exc.error if isinstance(exc, Refused) else exc  # a part missing, found only at submit
            if isinstance(missing, (Skip, ProviderNotInstalled)):
                skipped.append(missing.unusable if isinstance(missing, Skip) else Unusable.of(leg, missing))
                refused.append(f"{leg.label()}: {skipped[-1].why()}")
                log(f"{leg.label()}: {skipped[-1].why()}{following}")
                continue
            assert isinstance(exc, Refused)
            reason = exc.provider.capacity_error(exc.error)
            if reason is None:
                raise exc.error from None
            refused.append(f"{leg.label()} refused: {reason}")
            log(f"{leg.label()} refused the job for capacity or quota ({reason}){following}")
    if skipped and len(skipped) == len(refused):  # nothing was sent anywhere
        raise none_usable(skipped)
    if skipped:
        raise CloudtrainError("no provider of the fallback list took the job: " + "; ".join(refused),
                              remedy="install the providers not installed here ("
                                     + " or ".join(dict.fromkeys(u.remedy for u in skipped if u.remedy))
                                     + "), add providers or regions (providers.<name>.regions), or try again later")
    raise CloudtrainError("every provider of the fallback list refused the job for capacity or quota: "
                          + "; ".join(refused),
                          remedy="add providers or regions (providers.<name>.regions), or try again later")


def reaches(plan: Plan, uri: str) -> bool:
    """Whether the nodes of ``plan`` reach the store ``uri``: a cloud's nodes reach their own cloud's storage; a
    local, Slurm or Kubernetes job reaches any store this machine's credentials reach."""
    scheme = uri.split("://", 1)[0]
    staged = str(plan.staging.get("prefix") or "").split("://", 1)[0]
    return scheme not in _CLOUD_SCHEMES or staged not in _CLOUD_SCHEMES or scheme == staged


def move(legs_data: list[dict[str, Any]], leg: int, spec_data: dict[str, Any], current: JobHandle,
         status: JobStatus, why: str, log: Log = print) -> tuple[JobHandle, int]:
    """Continue the job on the next leg that takes it: carry its newest verified checkpoint there (unless that
    leg reaches the store it is in) and submit. Returns the new handle and its leg."""
    from cloudtrain.bundle.staging import lineage_id
    from cloudtrain.checkpoint.copy import carry_newest
    from cloudtrain.plan.planner import plan_job
    from cloudtrain.spec.model import validate_spec

    spec = validate_spec(spec_data)
    legs = [Leg(d["provider"], d.get("region")) for d in legs_data]  # a later version's keys left alone
    source = status.checkpoint_uri or spec.checkpoint.uri
    after, skipped = _installed_from(legs, leg + 1)  # a leg whose provider is not installed here is skipped
    passed = f" (skipping {'; '.join(f'{u.leg.label()}: {u.why()}' for u in skipped)})" if skipped else ""
    log(f"{current} ended {status.state.value} ({why}); moving it to {legs[after].label()}{passed}")
    target = source
    if source:
        with plan_job(leg_spec(spec, legs[after]), legs[after].provider) as plan:
            if not reaches(plan, source):
                home = str(plan.staging["prefix"]).split("/cloudtrain/", 1)[0]
                target = f"{home}/cloudtrain/checkpoints/{lineage_id(spec)}"
        if target and target != source:
            copied = carry_newest(source, target, log)
            log(f"carried step {copied.step} from {source} to {target}" if copied else
                f"no verified checkpoint under {source}: {legs[after].label()} starts from scratch")
    moved = leg_spec(spec, Leg(legs[after].provider), target) if target else spec
    _provider, handle, index, _refused = submit_first(moved, legs, start=after, log=log)
    return handle, index


def _installed_from(legs: list[Leg], start: int) -> tuple[int, list[Unusable]]:
    """The first leg from ``start`` whose provider is installed here, and those before it, which are not. None:
    exit 2, each leg named with its fix."""
    from cloudtrain.providers import get_provider

    skipped: list[Unusable] = []
    for index in range(start, len(legs)):
        try:
            get_provider(legs[index].provider)
            return index, skipped
        except ProviderNotInstalled as exc:
            skipped.append(Unusable.of(legs[index], exc))
    raise none_usable(skipped)


def lineage_text(history: list[dict[str, Any]]) -> list[str]:
    """One line per leg of a chain: where it ran and why it moved (``cloudtrain status``)."""
    lines = []
    for n, entry in enumerate(history):
        where = entry.get("provider", "?") + (f" {entry['region']}" if entry.get("region") else "")
        lines.append(f"  {n}. {entry.get('handle')}  on {where}: {entry.get('why', '')}")
    return lines
