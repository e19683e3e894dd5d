"""The ``cloudtrain`` command line's surface: every command, flag and choice (argparse), and nothing it does.

Choices that name providers (``--provider`` of doctor, config and catalog, ``--emulate``) come from the provider
registry when they are first needed (a value is parsed, help is printed), never while the parser is built: building it
reads no installed package's metadata, so ``cloudtrain --help`` stays as fast as the interpreter's own start.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from typing import Any

from cloudtrain import __version__

PROVIDERS = "{providers}"  # in a help text: the registered providers, read when the help is printed


def _provider_names() -> list[str]:
    from cloudtrain import registry

    return registry.names()


def expand_help(text: str) -> str:
    """A help text as shown: ``{providers}`` becomes the registered providers."""
    if PROVIDERS not in text:
        return text
    names = _provider_names()
    return text.replace(PROVIDERS, ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0])


class Registered:
    """Choices read from the provider registry at first use (a value checked, help or completion printed)."""

    def __init__(self, pick: Callable[[], list[str]]) -> None:
        self._pick = pick
        self._found: list[str] | None = None

    def _items(self) -> list[str]:
        if self._found is None:
            self._found = list(self._pick())
        return self._found

    def __contains__(self, value: object) -> bool:
        return value in self._items()

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __bool__(self) -> bool:
        return True  # never empty (the built-ins are always there); asked without reading the registry


def _emulated() -> list[str]:
    """What ``--emulate`` takes: each node contract's platform name, and the provider's own name for it."""
    from cloudtrain import registry

    found: list[str] = []
    for decl in registry.declarations().values():
        if decl.node and decl.name != "local":
            found += [decl.platform_name] + ([decl.name] if decl.name != decl.platform_name else [])
    return found


def _catalogued() -> list[str]:
    from cloudtrain.platforms import catalog

    return catalog.providers()


class _Formatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not action.help:
            return action.help
        text = expand_help(action.help)
        if isinstance(action.choices, Registered):  # shown as PROVIDER/PLATFORM in the usage: say which
            text += f" (one of: {', '.join(action.choices)})"
        return text


class Parser(argparse.ArgumentParser):
    """argparse, with help texts that may name the registered providers (subcommands inherit it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


PROVIDERS_HELP = f"{PROVIDERS} (default: local)"


OUTPUTS = ["text", "json", "yaml"]


def _count(low: int, high: int) -> Any:
    """An argparse type: a whole number in [low, high], so a huge value is one clear usage error (exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip()) if len(text.strip()) <= 30 else None
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}")
        return value
    return parse


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 10 ** 9:  # also false for nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (more than 0)")
    return value


def _duration(text: str) -> float:
    """An argparse type: a duration as the spec writes them (90, 30m, 6h)."""
    from cloudtrain.spec.fields import parse_duration

    try:
        value = parse_duration(text)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration ({exc}); e.g. 90, 30m, 6h") from None
    if not value or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration of more than 0; e.g. 90, 30m, 6h")
    return float(value)


def _output_flag(p: argparse.ArgumentParser, default: str = "text", choices: list[str] | None = None) -> None:
    p.add_argument("-o", "--output", choices=choices or OUTPUTS, default=default,
                   help=f"text for people (default: {default}), json or yaml for programs")


def _profile_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="settings profile from the config file (default: $CLOUDTRAIN_PROFILE or "
                                     "'default'; see `cloudtrain config`)")


def _job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("script", nargs="?", help="training script (its folder is packaged unless --source-dir is given)")
    p.add_argument("-f", "--file", help="job spec YAML (default: ./cloudtrain.yaml if there is one; SCRIPT, flags "
                                        "and '-- ARGS' override what it says)")
    p.add_argument("--no-spec", action="store_true", help="ignore ./cloudtrain.yaml: the job is SCRIPT and the flags")
    p.add_argument("-m", "--module", help="run a module (python -m) instead of a script")
    p.add_argument("-p", "--provider", help=PROVIDERS_HELP + "; 'cheapest': the first row of `plan --compare` that "
                                                             "can run")
    p.add_argument("--name", help="job name (default: from the script)")
    p.add_argument("--source-dir", help="folder to package (default: the script's folder)")
    p.add_argument("--nodes", type=int, help="number of nodes (machines)")
    p.add_argument("--procs-per-node", help="processes per node, or 'auto' (one per GPU)")
    p.add_argument("--strategy", choices=["ddp", "fsdp"])
    p.add_argument("--gpus", help="accelerator per node, e.g. A100:8 (`cloudtrain catalog` lists them)")
    p.add_argument("--checkpoint-uri", help="where checkpoints are kept: s3://, gs://, az://, file://")
    p.add_argument("--take-over", action="store_true", default=None,
                   help="take the checkpoint URI over from the job of another lineage that holds it (one that is "
                        "gone but whose lease has not expired, or one to stop writing there): that job writes no "
                        "more checkpoints there")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="the folder your script writes its checkpoints to (relative to its working folder): "
                        "restored into before it starts, published as it writes them, in any layout")
    p.add_argument("--checkpoint-file", action="append", default=[], metavar="GLOB",
                   help="a file every save writes, as a glob in the checkpoint folder (checkpoint-*/optimizer.pt); "
                        "repeatable: each save is published the moment all are whole and new, and the first save "
                        "of a run does not wait for the next to show it was whole")
    p.add_argument("--resume-arg", action="append", default=[], metavar="ARG",
                   help="an argument added to the script's only when a checkpoint was restored "
                        "(--resume-arg=--init_from=resume); repeatable")
    p.add_argument("--output-uri", help="where the job writes its outputs (default: per job, under the staging "
                                        "bucket or the local store)")
    p.add_argument("--image", help="custom container image URI")
    p.add_argument("--spot", action="store_true", default=None, help="use spot/preemptible capacity")
    p.add_argument("--max-restarts", type=int, help="resubmissions after preemption")
    p.add_argument("--max-cost", metavar="USD", help="budget at list prices across all restarts: the watcher (this "
                                                     "submit in the foreground, wait --recover) stops the job with a "
                                                     "final checkpoint when the cost accrued reaches it; without "
                                                     "one, max_runtime capped at what it buys does")
    p.add_argument("--max-recovery", help="the most time recovery may spend in all, e.g. 6h (default: 24h)")
    p.add_argument("--max-runtime", help="e.g. 3600, 90m, 2h (each platform's own limit is checked by plan)")
    p.add_argument("--max-idle", help="hang watchdog: stop the job when it prints nothing, writes no checkpoint and "
                                      "uses no CPU for this long, e.g. 10m (default: 30m; off turns it off)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment variable (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="set_fields",
                   help="any spec field by its dotted name, e.g. --set providers.aws.role=arn:... (repeatable)")
    p.add_argument("--allow-secret", action="append", default=[], metavar="PATTERN",
                   help="package a secret-looking file anyway (repeatable)")
    p.add_argument("--emulate", choices=Registered(_emulated), metavar="PLATFORM",
                   help="local only: run nodes under that platform's node contract (environment and files)")
    p.add_argument("--require-process-group", action="store_true", default=None,
                   help="fail the job when its processes each trained alone (none joined the job's process "
                        "group) instead of calling it a success; for CI")
    _profile_flag(p)
    _output_flag(p)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="cloudtrain",
        description="Run a PyTorch training script as a multi-node DDP/FSDP job on SageMaker, Azure ML, "
        "Vertex AI or locally.",
        epilog="Arguments after '--' go to the training script. Docs: cloudtrain <command> --help",
    )
    parser.add_argument("--version", action="version", version=f"cloudtrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    submit = sub.add_parser("submit", help="package, stage and run a job")
    _job_flags(submit)
    submit.add_argument("--dry-run", action="store_true", help="print the plan; send and stage nothing")
    submit.add_argument("--restore-from", type=_count(0, 10 ** 12), metavar="N",
                        help="resume from checkpoint N on purpose, not the newest: before the job starts, the newer "
                             "checkpoints are set aside in the store (not deleted; `cloudtrain checkpoints` lists "
                             "them), so its restarts and later submissions go on from N's line")
    submit.add_argument("--plan", metavar="PLAN_JSON", dest="saved_plan",
                        help="submit a plan saved with `cloudtrain plan ... -o json > plan.json`, as it is (same job "
                             "id); refused if the source changed since or the plan is over a day old")
    mode = submit.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true", help="return once the job is submitted")
    mode.add_argument("--follow", action="store_true", default=True, help="stream logs until the job ends (default)")

    plan = sub.add_parser("plan", help="show what submit would send, with a cost estimate (= submit --dry-run)")
    _job_flags(plan)
    plan.add_argument("--compare", action="store_true",
                      help="plan the job on every installed provider, as one table sorted by cost (offline)")
    plan.add_argument("--region", action="append", default=[], metavar="PROVIDER=REGION[,REGION]",
                      help="with --compare: also plan PROVIDER in these regions (repeatable)")
    plan.add_argument("--export", metavar="DIR", help="also write the platform's own files for this job into DIR "
                                                      "(new or empty), with a README naming the command that submits "
                                                      "them")

    for name, text in (("status", "show a job's state, progress and goodput"), ("cancel", "stop a job (idempotent)"),
                       ("preempt", "local jobs: send a rehearsed spot interruption (SIGTERM to every node)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("handle", help="a job handle, e.g. local://train-ddp-20260101-120000-ab12",
                       nargs="?" if name == "status" else None)
        _profile_flag(p)
        _output_flag(p, choices=[*OUTPUTS, "openmetrics"] if name == "status" else None)
    logs = sub.add_parser("logs", help="print a job's logs")
    logs.add_argument("handle")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--merge", action="store_true", help="every node's lines in one stream ordered by time (as -f "
                                                            "interleaves them), not node by node")
    _profile_flag(logs)
    wait = sub.add_parser("wait", help="block until a job ends; exit 0 only if it succeeded")
    wait.add_argument("handle")
    wait.add_argument("--timeout", type=_seconds, help="seconds")
    wait.add_argument("--recover", action="store_true",
                      help="resubmit the job while it ends preempted (Azure ML, Vertex); resumes a stopped watcher")
    wait.add_argument("--max-restarts", type=_count(0, 100), help="with --recover: at most this many resubmissions "
                                                        "(default: what the job's spec asked for)")
    wait.add_argument("--retry-failed", action="store_true", help="with --recover: resubmit failed jobs too")
    wait.add_argument("--max-recovery", type=_duration, help="with --recover: give up after recovering this long "
                                                             "in all, e.g. 6h (default: the spec's, else 24h)")
    _profile_flag(wait)
    _output_flag(wait)
    watch = sub.add_parser("watch", help="recover jobs without a laptop: resubmit or move preempted jobs until each "
                                         "chain ends (state in the checkpoint store; several watchers are safe)")
    watch.add_argument("handles", nargs="+", metavar="HANDLE", help="a job handle (any submission of its chain)")
    watch.add_argument("--poll", type=_seconds, default=30.0, help="seconds between rounds (default 30)")
    _profile_flag(watch)
    lst = sub.add_parser("list", help="list jobs")
    lst.add_argument("-p", "--provider", default="local", help=PROVIDERS_HELP)
    lst.add_argument("--limit", type=_count(1, 10_000), default=50, help="at most this many jobs (default: 50)")
    _profile_flag(lst)
    _output_flag(lst)
    outputs = sub.add_parser("outputs", help="list a job's outputs (final model, node logs); --download fetches them")
    outputs.add_argument("handle")
    outputs.add_argument("--download", metavar="DIR", help="copy every output into this folder")
    _profile_flag(outputs)
    _output_flag(outputs)

    checkpoints = sub.add_parser("checkpoints", help="list a job's (or a store's) checkpoints: step, lineage, files, "
                                                     "size, time, and whether a restore may take each")
    checkpoints.add_argument("target", metavar="TARGET", help="a job handle (its checkpoint store), or a store's URI "
                                                               "(s3://..., gs://..., az://..., file://..., a folder)")
    _profile_flag(checkpoints)
    _output_flag(checkpoints)

    report = sub.add_parser("report", help="write a job's timeline, progress, goodput and cost as one HTML page "
                                           "(self-contained: opens offline)")
    report.add_argument("handle")
    report.add_argument("-o", "--output", metavar="PATH",
                        help="a file, or a folder to write report-JOB.html into (default: ./report-JOB.html); a FIFO "
                             "or a device such as /dev/stdout is written into, never replaced")
    _profile_flag(report)

    cost = sub.add_parser("cost", help="what a job has cost so far at list prices: runtime per leg, restarts, "
                                       "spot savings")
    cost.add_argument("handle")
    _profile_flag(cost)
    _output_flag(cost)

    catalog = sub.add_parser("catalog", help="machines per accelerator, with GPU memory and list prices")
    catalog.add_argument("-p", "--provider", choices=Registered(_catalogued), metavar="PROVIDER",
                         help="one provider (default: all)")
    catalog.add_argument("--gpus", help="a GPU model, or MODEL:COUNT per node, e.g. A100 or H100:8")
    _output_flag(catalog)
    config = sub.add_parser("config", help="show provider settings and where each comes from; set user defaults")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION")
    show = config_sub.add_parser("show", help="each setting, its value and its source (the default action)")
    for p in (config, show):
        p.add_argument("-p", "--provider", choices=Registered(_provider_names), metavar="PROVIDER",
                       help="one provider")
        p.add_argument("-f", "--file", help="job spec YAML (default: ./cloudtrain.yaml if present)")
        p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="set_fields",
                       help="as on submit: shows how a flag would override the rest")
        _profile_flag(p)
        _output_flag(p)
    setter = config_sub.add_parser("set", help="store a default in a profile, e.g. `config set aws.region us-east-1`")
    setter.add_argument("key", help="PROVIDER.SETTING, e.g. aws.role, gcp.project, azure.workspace")
    setter.add_argument("value")
    unset = config_sub.add_parser("unset", help="remove a default from a profile")
    unset.add_argument("key")
    for p in (setter, unset):
        _profile_flag(p)
    config_sub.add_parser("path", help="print the config file's path")
    doctor = sub.add_parser("doctor", help="check installed extras and credentials per provider, with fixes")
    doctor.add_argument("-p", "--provider", choices=Registered(_provider_names), metavar="PROVIDER", action="append",
                        help="check only this provider (repeatable)")
    _output_flag(doctor)

    init = sub.add_parser("init", help="write a starter cloudtrain.yaml (and a reference trainer if none exists)")
    init.add_argument("--template", default="ddp", help="ddp or fsdp (see templates/)")
    init.add_argument("--dir", default=".", help="folder to write into")
    init.add_argument("--force", action="store_true", help="overwrite an existing cloudtrain.yaml")
    _output_flag(init, choices=["text", "json"])
    schema = sub.add_parser("schema", help="print the job spec's JSON Schema")
    _output_flag(schema, default="json", choices=["json", "yaml"])
    completion = sub.add_parser("completion", help="print a shell completion script: "
                                                   "eval \"$(cloudtrain completion bash)\"")
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    return parser
