"""The package holds what the job starts from: its script (or module) and its requirements file.

A ``.gitignore`` that happens to match the entry script (``*.py`` with a few ``!`` exceptions, ``scripts/``, a
``/train.py`` left over) made a package without it that planned fine and failed on every node ("can't open file").
Checked once the package is built, and refused at plan time naming what left the file out: the ignore file, its
line and rule, a built-in exclude, or cloudtrain's own reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.bundle.packaging import BUILTIN_EXCLUDES, IGNORE_FILES, PackageLimits, _matches
from cloudtrain.errors import PackagingError
from cloudtrain.regular_files import read_text

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.spec.model import JobSpec


# What a run writes into its checkpoint folder is state (.pt, .safetensors, .bin, .json, logs); files of these kinds
# are what a job imports or reads as it starts: code and configuration.
SOURCE_SUFFIXES = (".py", ".pyi", ".pyx", ".pxd", ".so", ".pyd", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini")


def _entry_files(spec: JobSpec, source: Path) -> list[tuple[str, str, str]]:
    """(field, what, path relative to the source) of the script, the module's file and the requirements file."""
    wanted: list[tuple[str, str, str]] = []
    if spec.script:
        wanted.append(("script", "script", _relative(spec.script)))
    if spec.module:
        base = spec.module.replace(".", "/")
        found = [c for c in (f"{base}.py", f"{base}/__main__.py") if (source / c).is_file()]
        wanted += [("module", "module", found[0])] if found else []
    if isinstance(spec.requirements, str):
        wanted.append(("requirements", "requirements file", _relative(spec.requirements)))
    return wanted


def check_checkpoint_folder(spec: JobSpec, source: Path, folder: str | None, package: Package) -> None:
    """A PackagingError (field checkpoint.dir) when checkpoint.dir, a folder of the source (``folder``), would take
    from the job what it runs: the package leaves that folder out, and each node starts the job with it empty (then
    restores the store's newest checkpoint there). Refused: a folder holding the script, the module, the requirements
    file, code or configuration (a local run's checkpoints there are left out, as the plan says), and a name that is
    a packaged file."""
    if folder is None:
        return
    given, flag = spec.checkpoint.dir, "--checkpoint-dir checkpoints (checkpoint.dir in a spec)"
    shipped = {f["path"] for f in package.files}
    parts = folder.split("/")
    file = next((sub for sub in ("/".join(parts[:depth]) for depth in range(1, len(parts) + 1)) if sub in shipped),
                None)
    if file is not None:
        raise PackagingError(f"{given!r} names the file {file} of the package: no node can make a folder there",
                             field="checkpoint.dir", remedy=f"give checkpoints a folder of their own, e.g. {flag}")
    entries = {rel: what for _, what, rel in _entry_files(spec, source)}
    needed = [f"{rel} (the {entries[rel]})" if rel in entries else rel for rel in package.taken
              if rel in entries or rel.lower().endswith(SOURCE_SUFFIXES)]
    if needed:
        shown = ", ".join(needed[:10]) + (f" and {len(needed) - 10} more" if len(needed) > 10 else "")
        raise PackagingError(
            f"{given!r} is the folder {folder}/ of the source, which holds what the job runs: {shown}; the package "
            "leaves the checkpoint folder out (each node starts the job with it empty, then restores the newest "
            "checkpoint into it), so every node would run without them",
            field="checkpoint.dir",
            remedy=f"give checkpoints a folder of their own, e.g. {flag}, or move those files out of {folder}/")


def check_entry_files(spec: JobSpec, source: Path, package: Package, limits: PackageLimits) -> None:
    """A PackagingError naming the rule when the script, the module or the requirements file is not packaged."""
    shipped = {f["path"] for f in package.files}
    for field, what, rel in _entry_files(spec, source):
        if rel not in shipped:
            why, remedy = _why_left_out(source, rel, limits, package)
            raise PackagingError(f"{what} {rel} is not in the package: {why}; every node would fail without it",
                                 field=field, remedy=remedy)


def _relative(path: str) -> str:
    return Path(os.path.normpath(path)).as_posix()


def _why_left_out(source: Path, rel: str, limits: PackageLimits, package: Package) -> tuple[str, str]:
    parts = rel.split("/")
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    for sub in prefixes:  # outermost first: a folder left out takes its files with it
        is_dir = sub != rel
        key = f"{sub}/" if is_dir else sub
        move = f"move {rel} out of {key}" if is_dir else f"rename {rel}"
        if key in package.left_out_why:
            return f"cloudtrain left out {key} ({package.left_out_why[key]})", move
        if _matches(sub.rsplit("/", 1)[-1], sub, BUILTIN_EXCLUDES):
            return f"{key} is never packaged (a built-in exclude: environments, build outputs, caches)", move
        rule = _deciding_rule(source, sub, is_dir, limits)
        if rule is not None:
            return f"{key} is ignored by {rule[0]} (`{rule[1]}`)", \
                f"remove or narrow that rule, or re-include it with a line `!{key}` in .cloudtrainignore (read " \
                "after .gitignore)"
    return "no rule found that leaves it out", "check the ignore files and package.exclude"


def _deciding_rule(source: Path, sub: str, is_dir: bool, limits: PackageLimits) -> tuple[str, str] | None:
    """(where, pattern) of the rule that ignores ``sub`` as the package walk reads the rules (the last match wins:
    the root's .gitignore, .cloudtrainignore and package.exclude, then each folder's own .gitignore, relative to
    it); None if no rule ignores it."""
    import pathspec

    decided: tuple[str, str] | None = None
    folders = [""] + ["/".join(sub.split("/")[:depth]) + "/" for depth in range(1, sub.count("/") + 1)]
    for prefix in folders:
        if prefix:
            sources = [(f"{prefix}.gitignore", _lines(source / prefix / ".gitignore"))]
        else:
            sources = [(name, _lines(source / name)) for name in IGNORE_FILES]
            sources.append(("package.exclude", list(limits.exclude)))
        target = sub[len(prefix):] + ("/" if is_dir else "")
        for where, lines in sources:
            for number, line in enumerate(lines, 1):
                negated = line.startswith("!")
                body = line[1:] if negated else line
                if body.strip() and not body.startswith("#") and \
                        pathspec.GitIgnoreSpec.from_lines([body]).match_file(target):
                    at = f"{where} line {number}" if where != "package.exclude" else "package.exclude"
                    decided = None if negated else (at, line)
    return decided


def _lines(path: Path) -> list[str]:
    try:
        return read_text(path, errors="replace").splitlines() if path.is_file() else []
    except OSError:
        return []
