"""Build the source bundle every node runs: the user's source, cloudtrain's own package and the bootstrap.

The bundle is deterministic (sorted members, zeroed times and owners, normalised modes, a fixed gzip header), so
the same inputs give the same bytes and digest on any machine, and staging can be content-addressed.

Layout inside the bundle::

    bootstrap.py          the in-node entrypoint (also staged beside the bundle so a node can start it)
    lib/cloudtrain/...    cloudtrain itself, put on PYTHONPATH so jobs need nothing but the image's torch
    lib/sitecustomize.py  installs cloudtrain's exit guard in every worker, then runs the image's own sitecustomize
    src/...               the user's source_dir
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import queue
import re
import shutil
import stat
import struct
import tarfile
import tempfile
import threading
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.errors import PackagingError
from cloudtrain.home import resource_dir, temp_dir

BUNDLE_NAME = "bundle.tar.gz"
BOOTSTRAP_NAME = "bootstrap.py"

# Never worth shipping: VCS data, environments, caches, build outputs.
BUILTIN_EXCLUDES = (
    ".git", ".hg", ".svn", ".venv", "venv", "env", ".nox", ".tox", "__pycache__", "*.pyc", "*.pyo",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "node_modules", "build", "dist",
    "*.egg-info", ".DS_Store", ".cloudtrain", "wandb", "mlruns",
)
# Refused unless explicitly allowed: these hold credentials far more often than not.
SECRET_PATTERNS = (
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_ecdsa*", "id_ed25519*", ".netrc",
    ".pypirc", ".git-credentials", ".npmrc", "credentials", "credentials.json", "*service-account*.json",
    "*serviceaccount*.json", "application_default_credentials.json", ".aws", ".ssh", ".azure", ".gcloud",
    ".kube",
)
SECRET_EXCEPTIONS = (".env.example", ".env.sample", ".env.template")

DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_FILES = 50_000
# Level 1: the bundle is uploaded once and read once; level 6 costs ~2x the CPU for a few % smaller bundles.
_GZIP_LEVEL = 1


IGNORE_FILES = (".gitignore", ".cloudtrainignore")  # read in this order: .cloudtrainignore may re-include (!)


@dataclass(frozen=True)
class PackageLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    allow_secrets: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # gitignore-style, on top of the source's own ignore files


@dataclass
class Package:
    """A built bundle on local disk plus its manifest. Close it (or use ``with``) to delete the temp file."""

    path: Path
    bootstrap: Path
    digest: str
    bundle_bytes: int
    files: list[dict[str, Any]] = field(default_factory=list)

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
        }

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
def _pattern(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regex for a set of globs: a walk over 10,000 files matches each name once, not per glob."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None


def _matches(name: str, rel: str, patterns: tuple[str, ...]) -> bool:
    regex = _pattern(patterns)
    return bool(regex and (regex.match(name) or regex.match(rel)))


def ignore_rules(folder: Path, extra: tuple[str, ...] = (), names: tuple[str, ...] = IGNORE_FILES) -> Any:
    """The gitignore rules a folder declares (``names``, in order) plus ``extra``, as one matcher; None if none."""
    lines: list[str] = []
    for name in names:
        path = folder / name
        if path.is_file():
            lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    lines += extra
    if not lines:
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)


def collect_files(root: Path, *, excludes: tuple[str, ...] = BUILTIN_EXCLUDES,
                  limits: PackageLimits = PackageLimits(), check_secrets: bool = True,
                  use_ignore_files: bool = True) -> list[tuple[str, Path, int]]:
    """Walk ``root``; return ``(relative posix path, absolute path, size)`` for every file to ship, sorted."""
    root = root.resolve()
    # (folder prefix, matcher): the root's .gitignore/.cloudtrainignore/package.exclude, then each nested .gitignore,
    # whose patterns are relative to its own folder, as git reads them.
    root_rules = ignore_rules(root, limits.exclude) if use_ignore_files else None
    found: list[tuple[str, Path, int]] = []
    secrets: list[str] = []

    def ignored(rel: str, rules: list[tuple[str, Any]]) -> bool:
        return any(spec.match_file(rel[len(prefix):]) for prefix, spec in rules)

    def is_secret(name: str, rel: str) -> bool:
        return check_secrets and _matches(name, rel, SECRET_PATTERNS) and not _matches(name, rel, SECRET_EXCEPTIONS) \
            and not _matches(name, rel, limits.allow_secrets)

    def walk(folder: Path, prefix: str, rules: list[tuple[str, Any]]) -> None:
        if prefix and use_ignore_files:
            nested = ignore_rules(folder, names=(".gitignore",))
            rules = [*rules, (prefix, nested)] if nested is not None else rules
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            if _matches(entry.name, rel, excludes):
                continue
            if entry.is_dir(follow_symlinks=False):
                if ignored(rel + "/", rules):
                    continue
                if is_secret(entry.name, rel):
                    secrets.append(rel + "/")
                    continue
                walk(Path(entry.path), rel + "/", rules)
                continue
            if ignored(rel, rules):
                continue
            if is_secret(entry.name, rel):
                secrets.append(rel)
                continue
            if entry.is_symlink():
                target = Path(entry.path).resolve()
                if not target.is_relative_to(root) or not target.is_file():
                    raise PackagingError(
                        f"{rel} is a link to {target}, outside the source folder",
                        field="source_dir",
                        remedy="copy the file into the source folder, or exclude the link",
                    )
                found.append((rel, Path(entry.path), target.stat().st_size))
            elif entry.is_file(follow_symlinks=False):  # sockets and fifos are skipped
                found.append((rel, Path(entry.path), entry.stat(follow_symlinks=False).st_size))

    walk(root, "", [("", root_rules)] if root_rules is not None else [])
    if secrets:
        shown = ", ".join(secrets[:10]) + (" ..." if len(secrets) > 10 else "")
        raise PackagingError(
            f"refusing to package files that usually hold credentials: {shown}",
            field="source_dir",
            remedy="move them out of the source folder, or allow them explicitly if they are safe "
            "(package.allow_secrets in the spec, or --allow-secret PATTERN)",
        )
    found.sort()
    _check_limits(found, limits)
    return found


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


def _runtime_files() -> list[tuple[str, Path]]:
    """cloudtrain's own package, shipped as lib/cloudtrain so nodes run the same code as this machine."""
    package_root = Path(__file__).resolve().parent
    files = collect_files(package_root, excludes=(*BUILTIN_EXCLUDES, "_entrypoints", "_templates"),
                          check_secrets=False, use_ignore_files=False)
    return [(f"lib/cloudtrain/{rel}", path) for rel, path, _ in files] + \
        [("lib/sitecustomize.py", package_root / "data" / "sitecustomize.py")]  # loads cloudtrain/exit_guard.py


def _add(tar: tarfile.TarFile, arcname: str, path: Path) -> None:
    info = tarfile.TarInfo(arcname)
    st = path.stat()
    info.size = st.st_size
    info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with open(path, "rb") as data:
        tar.addfile(info, data)


class _GzipPipe:
    """A write-only file for tarfile that gzips, hashes and writes in a second thread.

    tar framing and file reads stay on the caller's thread while deflate (which releases the GIL) runs on another
    core, the way `tar | gzip` splits the work. The gzip header is fixed (no name, mtime 0, OS 255) so the bytes
    are the same on every machine.
    """

    _CHUNK = 1 << 20

    def __init__(self, out: Any) -> None:
        self._out = out
        self._buffer = bytearray()
        self._written = 0  # uncompressed bytes; tarfile asks via tell()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._sha = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="cloudtrain-gzip", daemon=True)
        self._emit(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")
        self._thread.start()

    def _emit(self, data: bytes) -> None:
        self._out.write(data)
        self._sha.update(data)

    def _drain(self) -> None:
        deflate = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        crc = size = 0
        try:
            while (chunk := self._queue.get()) is not None:
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
                self._emit(deflate.compress(chunk))
            self._emit(deflate.flush() + struct.pack("<II", crc, size & 0xFFFFFFFF))
        except BaseException as exc:  # surfaced on the writer's thread by close()
            self._error = exc
            while self._queue.get() is not None:
                pass

    def tell(self) -> int:
        return self._written

    def write(self, data: bytes) -> int:
        self._written += len(data)
        self._buffer += data
        if len(self._buffer) >= self._CHUNK:
            self._queue.put(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def close(self) -> str:
        """Flush everything; return the sha256 hex digest of the gzip bytes."""
        if self._buffer:
            self._queue.put(bytes(self._buffer))
            self._buffer.clear()
        self._queue.put(None)
        self._thread.join()
        if self._error:
            raise self._error
        return self._sha.hexdigest()


def build_package(source_dir: Path, limits: PackageLimits = PackageLimits(), progress: bool = False) -> Package:
    """Bundle ``source_dir`` into a temp file; nothing is written anywhere else. ``progress``: a bar (or plain
    lines) on stderr while a large tree is bundled."""
    from cloudtrain.progress import Progress

    user_files = collect_files(source_dir, limits=limits)
    bootstrap = resource_dir("entrypoints") / BOOTSTRAP_NAME
    members = [(BOOTSTRAP_NAME, bootstrap), *_runtime_files(), *((f"src/{rel}", p) for rel, p, _ in user_files)]
    fd, tmp = tempfile.mkstemp(prefix="cloudtrain-bundle-", suffix=".tar.gz", dir=temp_dir())
    path = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as raw:
            pipe = _GzipPipe(raw)
            try:
                bar = Progress(f"bundling {source_dir}", total=len(members), unit="files", enabled=progress)
                with tarfile.open(fileobj=pipe, mode="w", format=tarfile.PAX_FORMAT) as tar, bar:  # type: ignore[call-overload]
                    for arcname, file in members:
                        _add(tar, arcname, file)
                        bar.advance()
            finally:
                digest = pipe.close()
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    files = [{"path": rel, "size": size} for rel, _, size in user_files]
    return Package(path=path, bootstrap=bootstrap, digest=f"sha256:{digest}", bundle_bytes=path.stat().st_size,
                   files=files)
