"""The job a ``submit``/``plan`` command line describes.

One rule, the same for every command: the project's spec file, ``./cloudtrain.yaml`` (or ``-f FILE``), applies when
there is one, and SCRIPT, flags and ``-- ARGS`` override what it says (``--no-spec`` ignores it). A command that uses
the spec file because it is there, beside a SCRIPT, says so on stderr, so nobody wonders which settings ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cloudtrain.errors import SpecError, UserError

# Job flags and their "not given" values: with --plan, the saved plan is submitted as it is, so these are refused.
_JOB_FLAGS: dict[str, Any] = {
    "script": None, "file": None, "no_spec": False, "module": None, "name": None, "source_dir": None, "nodes": None,
    "procs_per_node": None, "strategy": None, "gpus": None, "checkpoint_uri": None, "checkpoint_dir": None,
    "take_over": None, "checkpoint_file": [],
    "resume_arg": [], "output_uri": None, "image": None,
    "spot": None, "max_restarts": None, "max_cost": None, "max_recovery": None, "max_runtime": None, "max_idle": None,
    "set_fields": [],
    "allow_secret": [],
    "emulate": None, "require_process_group": None}


def env_pairs(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            # not echoed: a value without its name is often the secret itself (--env $HF_TOKEN)
            raise SpecError("a value without NAME= is not KEY=VALUE (not shown: it may be a secret)", field="--env",
                            remedy="write --env NAME=value")
        env[key] = value
    return env


def set_pairs(items: list[str]) -> dict[str, Any]:
    """``--set a.b=value``: the value is read as YAML, so numbers, booleans and lists keep their type (text that is
    not YAML stays text; a key given twice or nesting too deep is an error, as in the spec file)."""
    from cloudtrain.spec.files import parse_yaml

    pairs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{item!r} is not FIELD=VALUE", field="--set",
                            remedy="write --set providers.aws.region=us-east-1 (see `cloudtrain schema`)")
        parsed = parse_yaml(value, f"--set {key}", text_if_not_yaml=True) if value else value
        # no spec field is a float: "2.10" is a version, which YAML would read as the number 2.1
        pairs[key] = value if isinstance(parsed, float) else parsed
    return pairs


def spec_file_of(args: argparse.Namespace) -> tuple[str | None, bool]:
    """The spec file this command line uses, and whether it was picked because it is in this folder."""
    from cloudtrain.spec.files import project_spec

    if args.file is not None:
        return args.file, False
    found = None if args.no_spec else project_spec()
    return (f"./{found}", True) if found else (None, False)


def spec_from_args(args: argparse.Namespace, script_args: list[str]) -> tuple[Any, str | None]:
    """The validated JobSpec, and the spec file it started from (None: flags only)."""
    from cloudtrain.spec.model import apply_overrides, read_spec_file, validate_spec

    spec_file, implicit = spec_file_of(args)
    if spec_file is None and args.script is None and args.module is None:
        raise UserError("no training script given", field="SCRIPT",
                        remedy="pass a script (cloudtrain submit train.py), -f cloudtrain.yaml, "
                        "or run `cloudtrain init` to write a spec")
    raw = read_spec_file(spec_file) if spec_file is not None else {}
    if implicit and (args.script or args.module):
        print(f"note: using {spec_file} (SCRIPT, flags and '-- ARGS' override it; --no-spec ignores it)",
              file=sys.stderr)
    overrides: dict[str, Any] = {
        "name": args.name, "nodes": args.nodes, "procs_per_node": args.procs_per_node,
        "strategy": args.strategy, "accelerator": args.gpus, "checkpoint.uri": args.checkpoint_uri,
        "checkpoint.dir": args.checkpoint_dir, "checkpoint.take_over": args.take_over,
        "checkpoint.files": args.checkpoint_file or None,
        "resume_args": args.resume_arg or None,
        "output_uri": args.output_uri, "image.uri": args.image, "spot": args.spot,
        "max_restarts": args.max_restarts, "max_cost": args.max_cost, "max_recovery": args.max_recovery,
        "max_runtime": args.max_runtime,
        "max_idle": args.max_idle,
        "providers.local.emulate": args.emulate,  # a provider's name stands for its platform's (the spec maps it)
        "require_process_group": args.require_process_group,
    }
    if args.source_dir is not None:
        overrides["source_dir"] = _resolved(args.source_dir, "--source-dir")
    if args.script:
        script = Path(_resolved(args.script, "SCRIPT"))
        # --source-dir, else the spec file's source_dir, else the script's own folder
        given = overrides.get("source_dir") or raw.get("source_dir")
        source = Path(_resolved(given, "source_dir")) if isinstance(given, str) else script.parent
        if not script.is_file():
            from cloudtrain.regular_files import special

            kind = special(script)  # a FIFO is never opened
            raise SpecError(f"{args.script!r} " + (f"is {kind}, not a regular file" if kind else "does not exist"),
                            field="SCRIPT", remedy="give the path of your training script")
        if not script.is_relative_to(source):
            whose = "" if overrides.get("source_dir") or not raw.get("source_dir") else f" (source_dir of {spec_file})"
            raise SpecError(f"{args.script!r} is outside the source folder {source}{whose}", field="SCRIPT",
                            remedy="move the script into source_dir, or pass --source-dir"
                                   + (" (or --no-spec)" if implicit else ""))
        overrides.update(source_dir=str(source), script=str(script.relative_to(source)), module=None)
        raw.pop("module", None)
    if args.module is not None:
        overrides["module"] = args.module
        raw.pop("script", None)
    if script_args:
        overrides["args"] = script_args
    overrides.update(set_pairs(args.set_fields))
    merged = apply_overrides(raw, overrides)
    if args.env:
        merged["env"] = {**(merged.get("env") or {}), **env_pairs(args.env)}
    if args.allow_secret:
        package = dict(merged.get("package") or {})
        package["allow_secrets"] = [*package.get("allow_secrets", []), *args.allow_secret]
        merged["package"] = package
    return validate_spec(merged, source=spec_file), spec_file


def _resolved(path: str, field: str) -> str:
    if not path.strip():
        raise SpecError("is empty", field=field, remedy="give a path, or leave the flag out")
    try:
        return str(Path(path).expanduser().resolve())
    except (OSError, RuntimeError, ValueError) as exc:  # a symbolic link loop, a NUL byte ...
        raise SpecError(f"{path!r} cannot be resolved: {exc}", field=field, remedy="give an existing path") from None


def refuse_job_flags_with_saved_plan(args: argparse.Namespace, script_args: list[str]) -> None:
    """``submit --plan`` submits the saved plan as it is: flags that would change it are refused (``--env`` may
    only supply the secret values a saved plan never holds)."""
    given = [name for name, unset in _JOB_FLAGS.items() if getattr(args, name, unset) not in (unset, None)]
    if script_args:
        given.append("-- ARGS")
    if given:
        shown = ", ".join("--" + g.replace("_", "-") if g not in ("script", "-- ARGS") else g.upper() for g in given)
        raise UserError(f"{shown} cannot change a saved plan", field="--plan",
                        remedy="submit the saved plan as it is, or plan again with the changes "
                               "(`cloudtrain plan ... -o json > plan.json`)")
