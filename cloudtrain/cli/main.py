"""``cloudtrain`` command line. Bad input exits 2 with one message naming the field and the fix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cloudtrain.cli.parser import build_parser
from cloudtrain.cli.placement import compare_table, plan_legs_text, planned, poll_seconds, submit_legs, submitted
from cloudtrain.cli.placement import legs as legs_of
from cloudtrain.errors import EXIT_INTERRUPTED, EXIT_USAGE, CloudtrainError, UserError

__all__ = ["build_parser", "entry", "main"]

# -- commands ----------------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace, script_args: list[str]) -> int:
    from cloudtrain.cli.jobargs import spec_from_args
    from cloudtrain.cli.render import emit, plan_text

    spec, spec_file = spec_from_args(args, script_args)
    if getattr(args, "compare", False) or getattr(args, "region", None):  # plan only (submit --dry-run: not)
        return compare_table(args, spec, spec_file, colour())
    if (legs := legs_of(args, spec)) and len(legs) > 1:
        return plan_legs_text(args, spec, spec_file, legs, colour())
    with planned(args, spec, spec_file, legs) as plan:
        if args.output == "text":
            print(plan_text(plan, colour()))
        else:
            emit(plan.to_dict(), args.output)
        if getattr(args, "export", None):
            from cloudtrain.plan.export import export

            written = export(plan, Path(args.export))
            print(f"exported {len(written)} files to {args.export}: {args.export}/README.md has the command",
                  file=sys.stderr)
    return 0


def _restore_from(args: argparse.Namespace, uri: str | None, lineage: str | None) -> None:
    """submit --restore-from N: done to the job's store before anything is sent (jobs.submitted.restore_from)."""
    if getattr(args, "restore_from", None) is None:
        return
    from cloudtrain.jobs.submitted import restore_from

    restore_from(uri, args.restore_from, lineage, log=lambda line: print(line, file=sys.stderr))


def _plan_lineage(plan: Any) -> str | None:
    from cloudtrain import contract

    return plan.nodes[0].env.get(contract.LINEAGE) if plan.nodes else None


def cmd_submit(args: argparse.Namespace, script_args: list[str]) -> int:
    if args.dry_run and getattr(args, "restore_from", None) is not None:
        print(f"note: --restore-from {args.restore_from}: a submit sets aside the checkpoints newer than "
              f"{args.restore_from} in the job's store first (a dry run changes nothing)", file=sys.stderr)
    if args.dry_run and not args.saved_plan:
        return cmd_plan(args, script_args)
    from cloudtrain.cli.render import emit
    from cloudtrain.providers import get_provider

    if args.saved_plan:
        from cloudtrain.cli.jobargs import env_pairs, refuse_job_flags_with_saved_plan
        from cloudtrain.plan.saved import read_document, replanned, saved_plan_of

        refuse_job_flags_with_saved_plan(args, script_args)
        document = read_document(args.saved_plan)
        if isinstance(document, dict) and "legs" in document:  # saved for a provider list: submitted as one
            from cloudtrain.cli.placement import submit_saved_legs

            return submit_saved_legs(args, document)
        saved = saved_plan_of(document, args.saved_plan)
        if args.provider not in (None, saved.provider):
            raise UserError(f"{args.saved_plan!r} is a plan for {saved.provider}, not {args.provider}",
                            field="--provider", remedy="leave --provider out, or plan again for that provider")
        provider = get_provider(saved.provider)
        with replanned(saved, env_pairs(args.env), provider) as plan:  # what runs is what the file shows
            if args.dry_run:
                from cloudtrain.cli.render import plan_text

                print(plan_text(plan, colour())) if args.output == "text" else emit(plan.to_dict(), args.output)
                return 0
            _restore_from(args, plan.spec.checkpoint.uri, _plan_lineage(plan))
            handle, spec = provider.submit(plan), plan.spec
    else:
        from cloudtrain.cli.jobargs import spec_from_args

        spec, spec_file = spec_from_args(args, script_args)
        if (legs := legs_of(args, spec)) and len(legs) > 1:
            if getattr(args, "restore_from", None) is not None:
                from cloudtrain import contract
                from cloudtrain.bundle.staging import lineage_id

                _restore_from(args, spec.checkpoint.uri, spec.env.get(contract.LINEAGE) or lineage_id(spec))
            return submit_legs(args, spec, spec_file, legs)
        with planned(args, spec, spec_file, legs) as plan:
            provider = get_provider(plan.provider)
            _restore_from(args, plan.spec.checkpoint.uri, _plan_lineage(plan))
            handle = provider.submit(plan)
    return submitted(args, provider, handle, "", spec)


def _provider_for(handle_text: str) -> tuple[Any, Any]:
    from cloudtrain.handles import JobHandle
    from cloudtrain.providers import get_provider

    handle = JobHandle.parse(handle_text)
    return get_provider(handle.provider), handle


def cmd_status(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit, status_text
    from cloudtrain.jobs.recovery import load
    from cloudtrain.jobs.submitted import with_restart_point
    from cloudtrain.show import metrics

    if args.output == "openmetrics":  # every job this home has a timeline for, or the one named
        sys.stdout.write(metrics.exposition(metrics.job_figures(args.handle)))
        return 0
    if args.handle is None:
        raise UserError("status needs a job handle (only `status -o openmetrics` shows every job)",
                        remedy="`cloudtrain list` shows the known jobs")
    provider, handle = _provider_for(args.handle)
    status = with_restart_point(provider.describe(handle))
    chain = load(handle)
    if chain is not None and (chain.legs or chain.restarts):  # where each leg ran and why it moved
        status.recovery = {"chain": chain.chain, "restarts": chain.restarts, "history": chain.history}
    found = metrics.story(provider, handle, status)
    if args.output == "json":
        sys.stdout.write(metrics.json_text({**status.to_dict(), **found}))
        return 0
    if args.output != "text":
        emit({**status.to_dict(), **found}, args.output)
        return 0
    print(status_text(status, colour()))
    print("\n".join(metrics.status_lines(found)))
    if status.recovery:
        from cloudtrain.jobs.fallback import lineage_text

        print("lineage:")
        print("\n".join(lineage_text(status.recovery["history"])))
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from cloudtrain import storage
    from cloudtrain.checkpoint.inventory import inventory
    from cloudtrain.cli.render import checkpoints_text, emit

    target = args.target
    if "://" not in target and Path(target).is_dir():  # a store's folder on this machine
        target = Path(target).resolve().as_uri()
    if target.partition("://")[0] not in storage.schemes():  # a job handle: its store, as its platform holds it
        provider, handle = _provider_for(target)
        uri = provider.describe(handle).checkpoint_uri
        if not uri:
            raise UserError(f"{target} has no checkpoint store (checkpoint.uri)", field="HANDLE",
                            remedy="give the store's URI instead, if it has one")
    else:
        uri = target
    found = inventory(uri)
    if args.output == "text":
        print(checkpoints_text(found, colour()))
    else:
        emit(found, args.output)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from cloudtrain.show import report
    from cloudtrain.show.report_target import write

    provider, handle = _provider_for(args.handle)
    status, found, rate = report.for_job(provider, handle)
    data = report.page(status, found, rate).encode()
    # a folder: report-JOB.html in it; a FIFO or a device (/dev/stdout, /dev/null): written into, never replaced
    target, regular = write(data, args.output, handle.job_id)
    print(f"wrote {target} ({len(data) / 1e6:.2f} MB): open it in a browser (it needs no network)",
          file=sys.stdout if regular else sys.stderr)  # stdout may be the page itself
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit, status_text

    provider, handle = _provider_for(args.handle)
    status = provider.cancel(handle)
    print(status_text(status, colour())) if args.output == "text" else emit(status.to_dict(), args.output)
    return 0


def cmd_preempt(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit, status_text
    from cloudtrain.jobs.submitted import preempt

    status = preempt(*_provider_for(args.handle))
    if args.output != "text":
        sent = sum(1 for n in status.nodes or [] if n.get("exit_code") is None)
        emit({**status.to_dict(), "sent": {"signal": "SIGTERM", "nodes": sent}}, args.output)
        return 0
    from cloudtrain.cli.render import preempt_text

    print(preempt_text(status))
    print(status_text(status, colour()))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from cloudtrain.jobs.submitted import logs

    for line in logs(*_provider_for(args.handle), follow=args.follow, merge=args.merge):
        print(line, flush=True)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit, status_text

    provider, handle = _provider_for(args.handle)
    if args.recover:
        from cloudtrain.jobs.fallback import move
        from cloudtrain.jobs.recovery import wait_with_recovery

        status = wait_with_recovery(provider, handle, max_restarts=args.max_restarts, retry_failed=args.retry_failed,
                                    timeout=args.timeout, poll=poll_seconds(provider), max_recovery=args.max_recovery,
                                    mover=move, log=lambda m: print(m, file=sys.stderr, flush=True))
    else:
        status = provider.wait(handle, timeout=args.timeout, poll=poll_seconds(provider))
    from cloudtrain.jobs.submitted import with_restart_point

    status = with_restart_point(status)
    print(status_text(status, colour())) if args.output == "text" else emit(status.to_dict(), args.output)
    return 0 if status.state.value == "succeeded" else 1


def cmd_watch(args: argparse.Namespace) -> int:
    from cloudtrain.handles import JobHandle
    from cloudtrain.jobs.fallback import move
    from cloudtrain.jobs.watcher import watch

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    watched = watch([JobHandle.parse(h) for h in args.handles], poll=args.poll, log=say, mover=move)
    for item in watched:
        if item.final is not None:
            print(f"{item.state.root}: {item.final.state.value} ({item.final.handle})")
    return 0 if all(w.final is not None and w.final.state.value == "succeeded" for w in watched) else 1


def cmd_list(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit, table
    from cloudtrain.providers import get_provider

    statuses = get_provider(args.provider).list(args.limit)
    print(table(statuses, colour())) if args.output == "text" else emit([s.to_dict() for s in statuses], args.output)
    return 0


def cmd_outputs(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import columns, emit, size
    from cloudtrain.jobs.outputs import download, list_outputs, output_uri

    provider, handle = _provider_for(args.handle)
    uri = output_uri(provider, handle)
    if args.download:
        files = download(uri, Path(args.download))
        found = [{"uri": f.uri, "name": f.name, "bytes": f.bytes, "path": str(f.path)} for f in files]
    else:
        found = [{"uri": f.uri, "name": f.name, "bytes": f.bytes} for f in list_outputs(uri)]
    if args.output != "text":
        emit({"handle": str(handle), "output_uri": uri, "files": found}, args.output)
        return 0
    if not found:
        print(f"no outputs yet under {uri}")
        return 0
    rows = [("NAME", "SIZE", "PATH" if args.download else "URI")]
    rows += [(str(f["name"]), size(f["bytes"]) if isinstance(f["bytes"], int) else "-", str(f.get("path") or f["uri"]))
             for f in found]
    print(columns(rows, colour()))
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import cost_text, emit
    from cloudtrain.handles import JobHandle
    from cloudtrain.jobs.submitted import job_cost

    found = job_cost(JobHandle.parse(args.handle))
    print(cost_text(found, colour())) if args.output == "text" else emit(found, args.output)
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import catalog_text, emit
    from cloudtrain.platforms import catalog

    machines = catalog.search(args.provider, args.gpus)
    if args.output != "text":
        sources = {p: catalog.price_source(p).to_dict() for p in dict.fromkeys(m.provider for m in machines)}
        emit({"machines": [m.to_dict() for m in machines], "prices": sources}, args.output)
    else:
        print(catalog_text(machines, colour()))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from cloudtrain.spec import settings as config

    action = args.config_command or "show"
    if action == "path":
        print(config.config_path())
        return 0
    if action in ("set", "unset"):
        had = config.is_set(args.key, args.profile)
        path = config.set_value(args.key, args.value if action == "set" else None, args.profile)
        if action == "set":
            done = f"{args.key} = {args.value}"
        else:
            done = f"{args.key} removed" if had else f"{args.key} was not set"
        print(f"{done} in profile {args.profile or config.profile_name()} ({path})")
        note = config.after_set(args.key) if action == "set" else None
        if note:  # the value just stored changes nothing here: say what wins (issue 29.6)
            print(f"note: {note}", file=sys.stderr)
        return 0
    from cloudtrain.cli.jobargs import set_pairs
    from cloudtrain.cli.render import emit, settings_text
    from cloudtrain.spec.files import project_spec, read_spec_file

    spec_file = args.file or (str(found) if (found := project_spec()) else None)
    raw = read_spec_file(spec_file) if spec_file else {}
    flags = set_pairs(args.set_fields)
    from cloudtrain import registry

    providers = [args.provider] if args.provider else registry.names()
    shown = {p: config.explain(p, raw, flags) for p in providers}
    if args.output != "text":
        emit({"config_file": str(config.config_path()), "profile": config.profile_name(), "spec_file": spec_file,
              "settings": [s.to_dict() for settings in shown.values() for s in settings]}, args.output)
        return 0
    print(f"config file {config.config_path()}  profile {config.profile_name()}  spec {spec_file or '-'}")
    for provider, settings in shown.items():
        print()
        print(settings_text(provider, settings, colour()))
    notes = [n for settings in shown.values() for s in settings if (n := config.profile_loses(s, spec_file))]
    if notes:
        print()
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit
    from cloudtrain.show.doctor import diagnose, render

    checks = diagnose(args.provider)
    if args.output != "text":
        emit([c.to_dict() for c in checks], args.output)
    else:
        print(render(checks, color=colour()))
    return 1 if any(c.status == "missing" for c in checks) else 0


def cmd_completion(args: argparse.Namespace) -> int:
    from cloudtrain.cli.completion import script

    print(script(args.shell, build_parser()))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from cloudtrain.spec.templates import write_starter

    written = write_starter(args.template, Path(args.dir), force=args.force)
    if args.output == "json":
        from cloudtrain.cli.render import emit

        emit({"written": [str(p) for p in written]}, "json")
        return 0
    for path in written:
        print(f"wrote {path}")
    print("next: cloudtrain plan   (then: cloudtrain submit)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from cloudtrain.cli.render import emit
    from cloudtrain.spec.model import json_schema

    emit(json_schema(), args.output)
    return 0


def colour(stream: Any = None) -> bool:
    from cloudtrain.show.formatting import colour_enabled

    return colour_enabled(stream or sys.stdout)


def unrecognized(extra: list[str]) -> str:
    """argparse's message, plus the likely fix when the stray words are FIELD=VALUE pairs after --set or --env."""
    message = f"unrecognized arguments: {' '.join(extra)}"
    if any("=" in word and not word.startswith("-") for word in extra):
        message += ("\n  fix: --set and --env take one FIELD=VALUE each: repeat the flag "
                    "(--set a=1 --set b=2); arguments for your script go after --")
    return message


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, script_args = argv[:split], argv[split + 1:]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.error(unrecognized(extra))
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "profile", None):
            from cloudtrain.spec.settings import use_profile

            use_profile(args.profile)
        if args.command in ("submit", "plan"):
            return (cmd_submit if args.command == "submit" else cmd_plan)(args, script_args)
        if script_args:
            raise UserError(f"'--' arguments are only for submit/plan, not {args.command}")
        handler = globals()[f"cmd_{args.command}"]
        return int(handler(args))
    except CloudtrainError as exc:
        from cloudtrain.show.formatting import paint

        print(f"{paint('error:', 'red', colour(sys.stderr))} {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `cloudtrain logs ... | head`
        return 0
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave (a network error ...): a real failure
            raise
        # a folder or file given on the command line that cannot be read or written (init --dir, outputs
        # --download ...): the user's to fix, like any bad input
        from cloudtrain.show.formatting import paint

        print(f"{paint('error:', 'red', colour(sys.stderr))} {exc.filename}: {exc.strerror or exc}\n"
              "  fix: check the path and its permissions", file=sys.stderr)
        return EXIT_USAGE


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
