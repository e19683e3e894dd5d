"""Where a job runs, as the CLI decides it: the one provider asked for, a fallback list (``-p aws,gcp`` or the
spec's ``provider`` list, with each provider's regions), or the cheapest row of ``plan --compare``; and following
it to its end, with recovery, the budget watcher and fallback moves."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def planned(args: argparse.Namespace, spec: Any, spec_file: str | None, legs: list[Any]) -> Any:
    """The plan for --provider (its one leg); ``cheapest``: the first row of `plan --compare` that can run, said on
    stderr."""
    from cloudtrain.plan.compare import compare
    from cloudtrain.sdk import plan_job

    if legs:
        from cloudtrain.jobs.fallback import leg_spec

        return plan_job(leg_spec(spec, legs[0]), legs[0].provider, spec_file=spec_file)
    with compare(spec, spec_file=spec_file) as found:
        row = found.cheapest()
        plan = found.take(row)  # left open: the caller's `with` closes it after submit
        ready = sum(r.ready and r.hourly is not None for r in found.rows)
        from cloudtrain.show.formatting import money

        print(f"cheapest: {row.provider}{' ' + row.region if row.region else ''}, {row.instance}, "
              f"{money(row.hourly)}/h {(row.billed_as or 'on_demand').replace('_', '-')} (of {ready} ready with a "
              "list price; `cloudtrain plan --compare` shows every row)", file=sys.stderr)
    return plan


def compare_table(args: argparse.Namespace, spec: Any, spec_file: str | None, colour: bool) -> int:
    from cloudtrain.cli.render import compare_text, emit
    from cloudtrain.errors import UserError
    from cloudtrain.plan.compare import compare

    regions: dict[str, list[str]] = {}
    for item in args.region:
        name, sep, listed = item.partition("=")
        found = [r.strip() for r in listed.split(",") if r.strip()]
        if not sep or not name or not found:
            raise UserError(f"{item!r} is not PROVIDER=REGION[,REGION]", field="--region",
                            remedy="write e.g. --region aws=us-east-1,us-west-2")
        regions.setdefault(name.strip(), []).extend(found)
    providers = [args.provider] if args.provider and args.provider != "cheapest" else None
    with compare(spec, providers, regions, spec_file) as table:
        print(compare_text(table, colour)) if args.output == "text" else emit(table.to_dict(), args.output)
    return 0



def legs(args: argparse.Namespace, spec: Any) -> list[Any]:
    """Where the job may run, in order: ``-p aws,gcp`` or the spec's ``provider`` (and each provider's regions);
    none for ``-p cheapest`` (`plan --compare` picks the one)."""
    from cloudtrain.jobs.fallback import legs_of, provider_names
    from cloudtrain.plan.compare import CHEAPEST

    if args.provider == CHEAPEST:
        return []
    return legs_of(spec, *provider_names(spec, args.provider))


def plan_legs_text(args: argparse.Namespace, spec: Any, spec_file: str | None, legs: list[Any], colour: bool) -> int:
    from cloudtrain.jobs.fallback import plan_legs

    with plan_legs(spec, legs, spec_file) as plans:
        return show_legs(args, legs, plans, colour)


def show_legs(args: argparse.Namespace, legs: list[Any], plans: list[Any], colour: bool) -> int:
    """Each leg's plan, in order: as text, or one document sealed as a whole (`submit --plan` refuses legs
    reordered or edited since, and reads each leg's plan as a plan of its own). A leg whose provider is not
    installed here (``Unusable``) is named in its place with its fix, and no plan: a submit skips it."""
    from cloudtrain.cli.render import emit, plan_text
    from cloudtrain.jobs.fallback import Unusable
    from cloudtrain.plan.seal import SEAL, seal_parts

    unusable = [plan for plan in plans if isinstance(plan, Unusable)]
    if args.output != "text":
        document = {"legs": [plan.to_dict() if isinstance(plan, Unusable) else {**leg.to_dict(), "plan": plan.to_dict()}
                             for leg, plan in zip(legs, plans, strict=True)]}
        emit({**document, SEAL: seal_parts(document)}, args.output)
        for skipped in unusable:  # stdout is the document: said where a person reads it too
            print(f"note: {skipped.leg.label()}: {skipped.why()}; a submit skips it", file=sys.stderr)
        return 0
    first = next(n for n, plan in enumerate(plans, 1) if not isinstance(plan, Unusable))
    for n, (leg, plan) in enumerate(zip(legs, plans, strict=True), 1):
        if isinstance(plan, Unusable):
            print(f"{'-' * 8} leg {n}/{len(legs)}: {leg.label()} (not installed {plan.where}: a submit skips it)")
            print(f"{plan.message}\n  fix: {plan.remedy}" if plan.remedy else plan.message)
            print()
            continue
        print(f"{'-' * 8} leg {n}/{len(legs)}: {leg.label()}"
              + (" (tried first)" if n == first else " (if the ones before refuse or lose capacity)"))
        print(plan_text(plan, colour))
        print()
    return 0


def submit_legs(args: argparse.Namespace, spec: Any, spec_file: str | None, legs: list[Any]) -> int:
    from cloudtrain.jobs.fallback import plan_legs, submit_first

    with plan_legs(spec, legs, spec_file):  # every leg plans, and has its settings, before anything is sent
        pass
    provider, handle, leg, refused = submit_first(spec, legs, spec_file, log=_say)
    return _chained(args, provider, handle, legs, leg, refused, spec, spec.model_dump(mode="json", exclude_unset=True))


def submit_saved_legs(args: argparse.Namespace, document: dict[str, Any]) -> int:
    """`submit --plan` of a plan saved for a provider list (`plan -p local,slurm -o json`): every leg's plan made
    again and checked as the file shows it, then submitted as `submit -p local,slurm` would (the first leg that
    takes it; its chain recorded for recovery and moves). Submitted again, the same file is the same job. A leg
    whose provider is not installed here (or was not where the file was planned) is skipped, said on stderr."""
    from contextlib import ExitStack

    from cloudtrain.cli.jobargs import env_pairs
    from cloudtrain.errors import CloudtrainError, ProviderNotInstalled, UserError
    from cloudtrain.handles import JobHandle
    from cloudtrain.jobs.fallback import Leg, Refused, Skip, Unusable, none_usable, try_legs
    from cloudtrain.plan.saved import common_spec, replanned, saved_legs_of
    from cloudtrain.providers import get_provider

    found = saved_legs_of(document, args.saved_plan)
    legs = [Leg(leg["provider"], leg["region"]) for leg, _ in found]
    names = ",".join(dict.fromkeys(leg.provider for leg in legs))
    if args.provider not in (None, names):
        raise UserError(f"{args.saved_plan!r} is a plan for the provider list {names}, not {args.provider}",
                        field="--provider", remedy="leave --provider out, or plan again for that list")
    env = env_pairs(args.env)
    with ExitStack() as stack:
        plans: dict[Leg, Any] = {}  # each leg's plan made again, or why it cannot run here (Unusable)
        for one, (data, saved) in zip(legs, found, strict=True):
            if saved is None:  # not installed where the list was planned: nothing reviewed to submit there
                plans[one] = Unusable(one, data["not_installed"]["message"], data["not_installed"]["remedy"],
                                      where=f"where {args.saved_plan!r} was planned")
                continue
            try:
                plans[one] = stack.enter_context(replanned(saved, env, one.provider))
            except ProviderNotInstalled as exc:  # planned where it was installed, submitted where it is not
                plans[one] = Unusable.of(one, exc)
        usable = {one: plan for one, plan in plans.items() if not isinstance(plan, Unusable)}
        if not usable:
            raise none_usable(list(plans.values()))
        if args.dry_run:
            return show_legs(args, legs, list(plans.values()), colour=False)
        kept = common_spec([plan.spec.model_dump(mode="json", exclude_unset=True) for plan in usable.values()])
        by_id = {plan.job_id: plan for plan in usable.values()}
        # submitted before (on any leg of the file, installed here or not): that job, never a second one
        if (state := _chain_holding({saved.job_id for _, saved in found if saved is not None})) is not None:
            newest = JobHandle.parse(state.chain[-1])
            provider = get_provider(newest.provider)
            if len(state.chain) == 1 and newest.job_id in by_id:  # starts it where nothing did (a submit killed)
                provider.submit(by_id[newest.job_id])
            return submitted(args, provider, newest, f" on {legs[state.leg].label()}", by_id.get(
                newest.job_id, next(iter(usable.values()))).spec, state=state)

        def attempt(leg: Leg) -> tuple[Any, Any]:
            plan = plans[leg]
            if isinstance(plan, Unusable):
                raise Skip(plan)
            provider = get_provider(leg.provider)
            try:
                return provider, provider.submit(plan)
            except CloudtrainError as exc:
                raise Refused(provider, exc) from exc

        provider, handle, leg, refused = try_legs(legs, attempt, log=_say)
        return _chained(args, provider, handle, legs, leg, refused, plans[legs[leg]].spec, kept)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _chained(args: argparse.Namespace, provider: Any, handle: Any, legs: list[Any], leg: int, refused: list[str],
             spec: Any, kept: dict[str, Any]) -> int:
    """A job submitted on leg ``leg`` of ``legs``: its chain recorded with the spec later legs plan from."""
    from pathlib import Path as _Path

    from cloudtrain.jobs.recovery import start_chain

    kept = kept | {"source_dir": str(_Path(spec.source_dir).resolve())}
    state = start_chain(handle, legs=[leg.to_dict() for leg in legs], leg=leg, spec=kept, refused=refused,
                        max_restarts=spec.max_restarts, max_recovery=spec.max_recovery)
    return submitted(args, provider, handle, f" on {legs[leg].label()}", spec, state=state)


def _chain_holding(job_ids: set[str]) -> Any:
    """The recovery chain whose first submission is one of ``job_ids`` (a saved plan's legs), if this home has it."""
    import contextlib
    import json

    from cloudtrain.errors import CloudtrainError
    from cloudtrain.handles import JobHandle
    from cloudtrain.jobs import recovery

    folder = recovery.state_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError, CloudtrainError):
            root = JobHandle.parse(json.loads(path.read_text())["root"])
            if root.job_id in job_ids:
                return recovery.load(root)
    return None


def submitted(args: argparse.Namespace, provider: Any, handle: Any, where: str, spec: Any, state: Any = None) -> int:
    """After a submit: the handle (or its status as JSON) when detached, else its logs followed to the end."""
    if args.detach or args.output != "text":
        if args.output == "text":
            print(handle)
        else:
            from cloudtrain.cli.render import emit

            emit(provider.describe(handle).to_dict(), args.output)
        return 0
    print(f"submitted {handle}{where}", file=sys.stderr)
    return follow_job(provider, handle, spec.max_restarts, spec.max_recovery, state=state)


def follow_job(provider: Any, handle: Any, max_restarts: int = 0, max_recovery: float | None = None,
            state: Any = None) -> int:
    from cloudtrain.cli.follow import follow

    return follow(provider, handle, max_restarts, poll=poll_seconds(provider), max_recovery=max_recovery, state=state)


def poll_seconds(provider: Any) -> float:
    """Seconds between status checks: a local job answers from a file, a cloud from an API with rate limits."""
    return float(provider.poll_seconds)
