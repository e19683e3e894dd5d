"""Build the source bundle every node runs: the user's source, cloudtrain's own package and the bootstrap.

The bundle is deterministic (sorted members, zeroed times and owners, normalised modes, a fixed gzip header), so
the same inputs give the same bytes and digest on any machine, and staging can be content-addressed.

Layout inside the bundle::

    bootstrap.py          the in-node entrypoint (also staged beside the bundle so a node can start it)
    lib/cloudtrain/...    cloudtrain's node side (NODE_SIDE), put on PYTHONPATH so jobs need nothing but the image's
                          torch
    lib/sitecustomize.py  installs cloudtrain's exit guard in every worker, then runs the image's own sitecustomize
    src/...               the user's source_dir
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
import stat
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.bundle.plan_files import OUTPUT_WHY, SPEC_FILE_NAMES, SPEC_FILE_WHY, output_files, own_file_why
from cloudtrain.bundle.secret_scan import Finding, ScanningReader, describe
from cloudtrain.bundle.tarstream import GzipPipe, add_file, finish
from cloudtrain.errors import PackagingError
from cloudtrain.home.paths import resource_dir, temp_dir
from cloudtrain.regular_files import open_regular, read_text, special

BUNDLE_NAME = "bundle.tar.gz"
BOOTSTRAP_NAME = "bootstrap.py"

# Never worth shipping: VCS data, environments, caches, build outputs.
BUILTIN_EXCLUDES = (
    ".git", ".hg", ".svn", ".venv", "venv", "env", ".nox", ".tox", "__pycache__", "*.pyc", "*.pyo",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "node_modules", "build", "dist",
    "*.egg-info", ".DS_Store", ".cloudtrain", "wandb", "mlruns",
)
# Refused unless explicitly allowed (names compared without case): these hold credentials far more often than not.
SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "id_rsa*", "id_ecdsa*",
    "id_ed25519*", "id_dsa*", "deploy_key", "deploy_key.*", "*_deploy_key", ".netrc", ".pgpass", ".pypirc",
    ".git-credentials", ".npmrc", ".dockercfg", "credentials", "credentials.json", "credentials.csv",
    "*_credentials.csv", "*accesskeys.csv", "*service-account*.json", "*serviceaccount*.json", "*-key.json",
    "*_key.json", "key.json", "application_default_credentials.json", ".aws", ".ssh", ".azure", ".gcloud", ".kube",
    ".docker", "kaggle.json", ".kaggle", ".databrickscfg", ".boto", ".s3cfg", "kubeconfig", ".huggingface",
)
SECRET_EXCEPTIONS = (".env.example", ".env.sample", ".env.template", "*.env.example", "*.env.sample",
                     "*.env.template", "example.env", "sample.env", "template.env")
# `cloudtrain outputs --download DIR` marks DIR with this file; bundles leave such folders out (a downloaded model
# and logs are not source). Delete the file to package the folder.
DOWNLOAD_MARKER = ".cloudtrain-download"
# `cloudtrain plan --export DIR` marks DIR with this file, written before anything else there: the request it holds
# carries the job's secrets in clear, so bundles leave the folder out.
EXPORT_MARKER = ".cloudtrain-export"
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_FILES = 50_000


IGNORE_FILES = (".gitignore", ".cloudtrainignore")  # read in this order: .cloudtrainignore may re-include (!)


@dataclass(frozen=True)
class PackageLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    allow_secrets: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # gitignore-style, on top of the source's own ignore files
    own: tuple[tuple[str, str], ...] = ()  # (folder relative to the source, what it is): cloudtrain writes there
    # (folder relative to the source, what it is): the job writes there (checkpoint.dir), and a node starts with it
    # empty; left out, and what would have shipped from it is listed in Package.taken
    written: tuple[tuple[str, str], ...] = ()


@dataclass
class Package:
    """A built bundle on local disk plus its manifest. Close it (or use ``with``) to delete the temp file."""

    path: Path
    bootstrap: Path
    digest: str
    bundle_bytes: int
    files: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # not ignored, yet not shipped: spec files, downloads
    left_out_why: dict[str, str] = field(default_factory=dict)  # each of those, and why
    taken: list[str] = field(default_factory=list)  # files that would ship but for a folder the job writes (written)

    @property
    def source_bytes(self) -> int:
        return sum(f["size"] for f in self.files)

    def manifest(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "bundle_bytes": self.bundle_bytes,
            "file_count": len(self.files),
            "bytes": self.source_bytes,
            "files": self.files,
            **({"left_out": self.left_out} if self.left_out else {}),
        }

    def notes(self) -> list[str]:
        """What a plan says about the package: what cloudtrain left out on its own, and why (cloudtrain.yaml goes
        without saying; another YAML taken for a spec, downloaded outputs, an export or a FIFO may surprise). One
        line however many: the count, and the first few names of each reason (package.left_out names them all)."""
        said = {path: why for path, why in self.left_out_why.items()
                if not (path.rsplit("/", 1)[-1] in SPEC_FILE_NAMES and why == SPEC_FILE_WHY)}
        return [left_out_note(said)] if said else []

    def __post_init__(self) -> None:
        # The bundle is a temp file: delete it however the Package is dropped (notebooks rarely close things).
        self._finalizer = weakref.finalize(self, self.path.unlink, missing_ok=True)

    def close(self) -> None:
        self._finalizer()

    def staging_folder(self) -> Path:
        """A temp folder holding exactly what a node needs (bootstrap.py, bundle.tar.gz, manifest.json), for
        platforms that upload a folder as the job's code; deleted with the package."""
        folder = Path(tempfile.mkdtemp(prefix="cloudtrain-code-", dir=temp_dir()))
        weakref.finalize(self, shutil.rmtree, folder, True)
        shutil.copyfile(self.bootstrap, folder / BOOTSTRAP_NAME)
        try:
            os.link(self.path, folder / BUNDLE_NAME)  # same disk: no copy of a possibly large bundle
        except OSError:
            shutil.copyfile(self.path, folder / BUNDLE_NAME)
        (folder / "manifest.json").write_text(json.dumps(self.manifest(), indent=1))
        return folder

    def __enter__(self) -> Package:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def _pattern(patterns: tuple[str, ...], ignore_case: bool = False) -> re.Pattern[str] | None:
    """One compiled regex for a set of globs: a walk over 10,000 files matches each name once, not per glob."""
    flags = re.IGNORECASE if ignore_case else 0
    return re.compile("|".join(fnmatch.translate(p) for p in patterns), flags) if patterns else None


def _matches(name: str, rel: str, patterns: tuple[str, ...], ignore_case: bool = False) -> bool:
    regex = _pattern(patterns, ignore_case)
    return bool(regex and (regex.match(name) or regex.match(rel)))


def _same_file(path: Path, identities: set[tuple[int, int]]) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in identities


def ignore_rules(folder: Path, extra: tuple[str, ...] = (), names: tuple[str, ...] = IGNORE_FILES) -> Any:
    """The gitignore rules a folder declares (``names``, in order) plus ``extra``, as one matcher; None if none."""
    lines: list[str] = []
    for name in names:
        path = folder / name
        if path.is_file():
            lines += read_text(path, errors="replace").splitlines()
    lines += extra
    if not lines:
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)


def collect_files(root: Path, *, excludes: tuple[str, ...] = BUILTIN_EXCLUDES,
                  limits: PackageLimits = PackageLimits(), check_secrets: bool = True,
                  use_ignore_files: bool = True,
                  left_out: dict[str, str] | None = None,
                  taken: list[str] | None = None) -> list[tuple[str, Path, int]]:
    """Walk ``root``; return ``(relative posix path, absolute path, size)`` for every file to ship, sorted.

    With ``check_secrets`` (the user's source), credential files are refused, links are judged by their target too,
    and cloudtrain's own files are left out and named in ``left_out`` (path -> why, "" where the path says it): spec
    files, saved plans, downloaded outputs, exports, cloudtrain's stores (``limits.own``). Special files (a FIFO,
    a socket, a device) are never opened: left out, and named there too. The folders the job writes
    (``limits.written``) are left out too; the files that would have shipped from them go to ``taken``."""
    root = root.resolve()
    # (folder prefix, matcher): the root's .gitignore/.cloudtrainignore/package.exclude, then each nested .gitignore,
    # whose patterns are relative to its own folder, as git reads them.
    root_rules = ignore_rules(root, limits.exclude) if use_ignore_files else None
    found: list[tuple[str, Path, int]] = []
    secrets: list[str] = []
    misnamed: list[str] = []  # names that are not UTF-8 text
    omitted = left_out if left_out is not None else {}
    own = {folder.strip("/"): what for folder, what in limits.own}
    written = {folder.strip("/"): what for folder, what in limits.written}
    took = taken if taken is not None else []
    being_written = output_files() if check_secrets else set()

    def ignored(rel: str, rules: list[tuple[str, Any]]) -> bool:
        return any(spec.match_file(rel[len(prefix):]) for prefix, spec in rules)

    def is_secret(name: str, rel: str) -> bool:
        return check_secrets and _matches(name, rel, SECRET_PATTERNS, True) \
            and not _matches(name, rel, SECRET_EXCEPTIONS, True) and not _matches(name, rel, limits.allow_secrets)

    def nested_rules(folder: Path, prefix: str, rules: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        nested = ignore_rules(folder, names=(".gitignore",)) if prefix and use_ignore_files else None
        return [*rules, (prefix, nested)] if nested is not None else rules

    def judge(path: Path, rel: str, name: str, is_dir: bool, rules: list[tuple[str, Any]]) -> tuple[str, str] | None:
        """(what happens, why) to a file or folder that does not ship as it is: "skip" (excluded or ignored),
        "refuse" (a credentials file) or "omit" (cloudtrain's own files: left out, and the plan says so)."""
        rel, name = shown_path(rel), shown_path(name)  # a name that is not UTF-8 is matched as \xNN (re2 needs text)
        if _matches(name, rel, excludes):
            return "skip", "never packaged (BUILTIN_EXCLUDES)"
        if ignored(rel + "/" if is_dir else rel, rules):
            return "skip", "ignored (.gitignore, .cloudtrainignore or package.exclude)"
        kind = None if is_dir else special(path)  # a FIFO is never opened: reading it would wait for a writer
        if kind:
            return "omit", f"{kind}, not a regular file: never read or packaged"
        if is_secret(name, rel):
            return "refuse", "a credentials file"
        if check_secrets and is_dir and rel in own:
            return "omit", f"{own[rel]}: cloudtrain writes there"
        if check_secrets and is_dir and rel in written:
            return "omit", written[rel]
        if check_secrets and is_dir and (path / EXPORT_MARKER).exists():
            return "omit", "written by `cloudtrain plan --export`: its request holds the job's secrets in clear"
        if check_secrets and is_dir and (path / DOWNLOAD_MARKER).exists():
            return "omit", f"downloaded outputs; delete {rel}/{DOWNLOAD_MARKER} to package it"
        if being_written and not is_dir and _same_file(path, being_written):
            return "omit", OUTPUT_WHY
        plan = own_file_why(path) if check_secrets and not is_dir else None  # a spec file or saved plan
        return ("omit", plan) if plan else None

    def link(rel: str, path: Path) -> int:
        """A link ships its target's content, so the target must be a file that would ship by its own path."""
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError) as exc:  # a dangling link, or a loop (RuntimeError before Python 3.13)
            raise PackagingError(f"{rel} is a link that cannot be followed ({exc})", field="source_dir",
                                 remedy="remove the link, or exclude it (.cloudtrainignore)") from None
        if not target.is_relative_to(root) or target == root:
            raise PackagingError(
                f"{rel} is a link to {target}, outside the source folder",
                field="source_dir",
                remedy="copy the file into the source folder, or exclude the link",
            )
        target_rel = target.relative_to(root).as_posix()
        why = "a folder (bundles hold plain files)" if target.is_dir() else None
        rules = [("", root_rules)] if root_rules is not None else []
        parts = target_rel.split("/")
        for depth in range(len(parts)):  # the target's own path, folder by folder, as the walk would judge it
            sub = "/".join(parts[:depth + 1])
            is_dir = depth < len(parts) - 1
            why = why or (judge(root / sub, sub, parts[depth], is_dir, rules) or (None, None))[1]
            if is_dir:
                rules = nested_rules(root / sub, sub + "/", rules)
        if why:
            raise PackagingError(
                f"{rel} is a link to {target_rel}, which is {why}: the link would ship it anyway",
                field="source_dir",
                remedy="remove the link or exclude it (.cloudtrainignore); copy the file in if it is safe to ship")
        return target.stat().st_size

    def walk(folder: Path, prefix: str, rules: list[tuple[str, Any]], taking: bool = False) -> None:
        """``taking``: inside a folder the job writes, whose files only go to ``taken`` (nothing there is
        refused: a local run's checkpoints may hold a link to the newest)."""
        rules = nested_rules(folder, prefix, rules)
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            action, why = judge(Path(entry.path), rel, entry.name, is_dir, rules) or (None, None)  # a link: by name
            if check_secrets and not action and not taking and not _utf8(entry.name):
                misnamed.append(shown_path(rel + "/" if is_dir else rel))
            elif taking:
                if not action and is_dir:
                    walk(Path(entry.path), rel + "/", rules, True)
                elif not action:
                    took.append(shown_path(rel))
            elif action == "refuse":
                secrets.append(shown_path(rel + "/" if is_dir else rel))
            elif action == "omit":  # named in the plan: as text it can print and store
                omitted[shown_path(f"{rel}/" if is_dir else rel)] = str(why)
                if is_dir and rel in written:
                    walk(Path(entry.path), rel + "/", rules, True)
            elif action:
                continue
            elif is_dir:
                walk(Path(entry.path), rel + "/", rules)
            elif entry.is_symlink():
                found.append((rel, Path(entry.path), link(rel, Path(entry.path))))
            elif entry.is_file(follow_symlinks=False):
                found.append((rel, Path(entry.path), entry.stat(follow_symlinks=False).st_size))

    walk(root, "", [("", root_rules)] if root_rules is not None else [])
    if misnamed:  # a plan, a job's record and a platform's API hold names as UTF-8 text: said before any is made
        raise PackagingError(
            f"cannot package {_few(misnamed)}: {'names that are' if misnamed[1:] else 'a name that is'} not "
            "UTF-8 text (an old archive's, another system's encoding)",
            field="source_dir", remedy="rename it with a UTF-8 name (`convmv -f latin1 -t utf-8 -r --notest DIR` "
                                       "renames a tree), or leave it out (.cloudtrainignore, or package.exclude)")
    if secrets:
        raise PackagingError(
            f"refusing to package files that usually hold credentials: {_few(secrets)}",
            field="source_dir",
            remedy="move them out of the source folder, or allow them explicitly if they are safe "
            "(package.allow_secrets in the spec, or --allow-secret PATTERN)",
        )
    found.sort()
    _check_limits(found, limits)
    return found


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.scandir keeps bytes that are not UTF-8 as lone surrogates
        return False
    return True


def shown_path(path: str) -> str:
    """A file name as text that can be printed and stored: bytes that are not UTF-8 as \\xNN."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def left_out_note(why_of: dict[str, str], most: int = 5) -> str:
    """One line for the paths left out (path -> why): ``package: left out 3 files: a.json, b.json (why); c/ (why)``,
    at most ``most`` names a reason, then how many more."""
    if len(why_of) == 1:
        [(path, why)] = why_of.items()
        return f"package: left out {path} ({why})"
    by_why: dict[str, list[str]] = {}
    for path, why in why_of.items():
        by_why.setdefault(why, []).append(path)
    shown = "; ".join(", ".join(paths[:most]) + (f" and {len(paths) - most:,} more" if len(paths) > most else "")
                      + f" ({why})" for why, paths in by_why.items())
    folders = sum(path.endswith("/") for path in why_of)
    counted = " and ".join(f"{n:,} {word}{'s' if n != 1 else ''}"
                           for n, word in ((len(why_of) - folders, "file"), (folders, "folder")) if n)
    return f"package: left out {counted}: {shown}"


def _few(paths: list[str], most: int = 10) -> str:
    return ", ".join(paths[:most]) + (" ..." if len(paths) > most else "")


def _check_limits(found: list[tuple[str, Path, int]], limits: PackageLimits) -> None:
    sizes = [(size, rel) for rel, _, size in found]
    total = sum(s for s, _ in sizes)
    if len(found) <= limits.max_files and total <= limits.max_bytes:
        return
    by_dir: dict[str, int] = {}
    for size, rel in sizes:
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        by_dir[top] = by_dir.get(top, 0) + size
    largest = sorted(by_dir.items(), key=lambda kv: -kv[1])[:5]
    shown = ", ".join(f"{name} ({size / 1e6:.1f} MB)" for name, size in largest)
    raise PackagingError(
        f"source folder too large: {len(found)} files, {total / 1e6:.1f} MB "
        f"(limits: {limits.max_files} files, {limits.max_bytes / 1e6:.0f} MB); largest: {shown}",
        field="source_dir",
        remedy="keep data out of the source folder (use `inputs:` for data) or exclude it",
    )


# What of cloudtrain a node runs (under lib/cloudtrain), by folder: the node package and what it may import
# (pyproject.toml's import contract "Node-side code ... imports nothing client-side"), the runtime the workers
# import, and the providers' node contracts (the bootstrap loads them by file). The client side stays here.
NODE_SIDE = ("__init__.py", "_lazy.py", "backoff.py", "contract.py", "entry_points.py", "errors.py", "safe_json.py",
             "node/", "checkpoint/", "storage/", "runtime/", "providers/*/node.py")


def _runtime_files() -> list[tuple[str, Path]]:
    """cloudtrain's node side (NODE_SIDE), shipped as lib/cloudtrain so nodes run the same code as this machine."""
    package_root = Path(__file__).resolve().parent.parent  # cloudtrain/, above bundle/
    files = collect_files(package_root, excludes=(*BUILTIN_EXCLUDES, "_entrypoints", "_templates"),
                          check_secrets=False, use_ignore_files=False)
    node_side = [(rel, path) for rel, path, _ in files
                 if any(rel.startswith(part) if part.endswith("/") else fnmatch.fnmatchcase(rel, part)
                        for part in NODE_SIDE)]
    return [(f"lib/cloudtrain/{rel}", path) for rel, path in node_side] + \
        [("lib/sitecustomize.py", package_root / "data" / "sitecustomize.py")]  # loads cloudtrain/node/exit_guard.py


def _add(out: GzipPipe, arcname: str, path: Path, scan_as: str | None = None) -> list[Finding]:
    """Add one file; with ``scan_as`` (its path in the source), look for credentials in what is read for the tar."""
    st = path.stat()
    mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    with open_regular(path) as data:  # swapped for a FIFO since the walk: refused, never waited on
        reader = ScanningReader(scan_as, data, path) if scan_as is not None else None
        add_file(out, arcname, st.st_size, mode, reader or data)
    return reader.findings() if reader else []


def build_package(source_dir: Path, limits: PackageLimits = PackageLimits(), progress: bool = False,
                  lib: dict[str, Path] | None = None) -> Package:
    """Bundle ``source_dir`` into a temp file; nothing is written anywhere else. ``progress``: a bar (or plain
    lines) on stderr while a large tree is bundled. ``lib``: more files for lib/ (a plugin provider's node
    contract), by their path there."""
    from cloudtrain.progress import Progress

    left_out: dict[str, str] = {}
    taken: list[str] = []
    user_files = collect_files(source_dir, limits=limits, left_out=left_out, taken=taken)
    bootstrap = resource_dir("entrypoints") / BOOTSTRAP_NAME
    members: list[tuple[str, Path, str | None]] = [
        (BOOTSTRAP_NAME, bootstrap, None), *((arcname, p, None) for arcname, p in _runtime_files()),
        *((f"lib/{path}", file, None) for path, file in sorted((lib or {}).items())),
        *((f"src/{rel}", p, None if _matches(rel.rsplit("/", 1)[-1], rel, limits.allow_secrets) else rel)
          for rel, p, _ in user_files)]
    findings: list[Finding] = []
    fd, tmp = tempfile.mkstemp(prefix="cloudtrain-bundle-", suffix=".tar.gz", dir=temp_dir())
    path = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as raw:
            pipe = GzipPipe(raw)
            try:
                with Progress(f"bundling {source_dir}", total=len(members), unit="files", enabled=progress) as bar:
                    for arcname, file, scan_as in members:
                        findings += _add(pipe, arcname, file, scan_as)
                        bar.advance()
                finish(pipe)
            finally:
                digest = pipe.close()
        if findings:
            raise PackagingError(
                f"refusing to package credentials found in {describe(findings)}",
                field="source_dir",
                remedy="pass secrets to the job with --env / env: (masked in plans and logs) instead of keeping "
                       "them in files; if one is not a real credential, end its line with the comment "
                       "`cloudtrain: allow-secret`, or allow the whole file (package.allow_secrets in the spec, "
                       "or --allow-secret PATTERN)")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    files = [{"path": rel, "size": size} for rel, _, size in user_files]
    return Package(path=path, bootstrap=bootstrap, digest=f"sha256:{digest}", bundle_bytes=path.stat().st_size,
                   files=files, left_out=list(left_out), left_out_why=left_out, taken=taken)
