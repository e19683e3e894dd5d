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
    from cloudtrain.compare import compare
    from cloudtrain.sdk import plan_job

    if legs:
        from cloudtrain.fallback import leg_spec

        return plan_job(leg_spec(spec, legs[0]), legs[0].provider, spec_file=spec_file)
    with compare(spec, spec_file=spec_file) as found:
        row = found.cheapest()
        plan = found.take(row)  # left open: the caller's `with` closes it after submit
        ready = sum(r.ready and r.hourly is not None for r in found.rows)
        from cloudtrain.formatting import money

        print(f"cheapest: {row.provider}{' ' + row.region if row.region else ''}, {row.instance}, "
              f"{money(row.hourly)}/h {(row.billed_as or 'on_demand').replace('_', '-')} (of {ready} ready with a "
              "list price; `cloudtrain plan --compare` shows every row)", file=sys.stderr)
    return plan


def compare_table(args: argparse.Namespace, spec: Any, spec_file: str | None, colour: bool) -> int:
    from cloudtrain.cli.render import compare_text, emit
    from cloudtrain.compare import compare
    from cloudtrain.errors import UserError

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
    from cloudtrain.compare import CHEAPEST
    from cloudtrain.fallback import legs_of, provider_names

    if args.provider == CHEAPEST:
        return []
    return legs_of(spec, *provider_names(spec, args.provider))


def plan_legs_text(args: argparse.Namespace, spec: Any, spec_file: str | None, legs: list[Any], colour: bool) -> int:
    from cloudtrain.cli.render import emit, plan_text
    from cloudtrain.fallback import plan_legs

    with plan_legs(spec, legs, spec_file) as plans:
        if args.output != "text":
            emit({"legs": [{**leg.to_dict(), "plan": plan.to_dict()} for leg, plan in zip(legs, plans, strict=True)]},
                 args.output)
            return 0
        for n, (leg, plan) in enumerate(zip(legs, plans, strict=True), 1):
            print(f"{'-' * 8} leg {n}/{len(legs)}: {leg.label()}"
                  + (" (tried first)" if n == 1 else " (if the ones before refuse or lose capacity)"))
            print(plan_text(plan, colour))
            print()
    return 0


def submit_legs(args: argparse.Namespace, spec: Any, spec_file: str | None, legs: list[Any]) -> int:
    from pathlib import Path as _Path

    from cloudtrain.fallback import plan_legs, submit_first
    from cloudtrain.recovery import start_chain

    with plan_legs(spec, legs, spec_file):  # every leg plans, and has its settings, before anything is sent
        pass
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    provider, handle, leg, refused = submit_first(spec, legs, spec_file, log=say)
    kept = spec.model_dump(mode="json", exclude_unset=True) | {"source_dir": str(_Path(spec.source_dir).resolve())}
    state = start_chain(handle, legs=[leg.to_dict() for leg in legs], leg=leg, spec=kept, refused=refused,
                        max_restarts=spec.max_restarts, max_recovery=spec.max_recovery)
    return submitted(args, provider, handle, f" on {legs[leg].label()}", spec, state=state)


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
