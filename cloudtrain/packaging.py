"""Build the source bundle every node runs: the user's source, cloudtrain's own package and the bootstrap.

The bundle is deterministic (sorted members, zeroed times and owners, normalised modes, a fixed gzip header), so
the same inputs give the same bytes and digest on any machine, and staging can be content-addressed.

Layout inside the bundle::

    bootstrap.py          the in-node entrypoint (also staged beside the bundle so a node can start it)
    lib/cloudtrain/...    cloudtrain itself, put on PYTHONPATH so jobs need nothing but the image's torch
    src/...               the user's source_dir
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import os
import stat
import tarfile
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.errors import PackagingError
from cloudtrain.home import resource_dir

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
_GZIP_LEVEL = 6


@dataclass(frozen=True)
class PackageLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    allow_secrets: tuple[str, ...] = ()


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

    def __enter__(self) -> Package:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _matches(name: str, rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in patterns)


def collect_files(root: Path, *, excludes: tuple[str, ...] = BUILTIN_EXCLUDES,
                  limits: PackageLimits = PackageLimits(), check_secrets: bool = True) -> list[tuple[str, Path]]:
    """Walk ``root`` and return ``(relative posix path, absolute path)`` pairs, sorted."""
    found: list[tuple[str, Path]] = []
    secrets: list[str] = []
    root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        kept_dirs = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir != "." else d
            if _matches(d, rel, excludes) or (base / d).is_symlink():
                continue
            if check_secrets and _matches(d, rel, SECRET_PATTERNS) and not _matches(d, rel, limits.allow_secrets):
                secrets.append(rel + "/")
                continue
            kept_dirs.append(d)
        dirnames[:] = kept_dirs
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir != "." else name
            path = base / name
            if _matches(name, rel, excludes):
                continue
            if check_secrets and _matches(name, rel, SECRET_PATTERNS) and not _matches(name, rel, SECRET_EXCEPTIONS) \
                    and not _matches(name, rel, limits.allow_secrets):
                secrets.append(rel)
                continue
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(root) or not target.is_file():
                    raise PackagingError(
                        f"{rel} is a link to {target}, outside the source folder",
                        field="source_dir",
                        remedy="copy the file into the source folder, or exclude the link",
                    )
            elif not path.is_file():
                continue  # sockets, fifos
            found.append((rel, path))
    if secrets:
        shown = ", ".join(secrets[:10]) + (" ..." if len(secrets) > 10 else "")
        raise PackagingError(
            f"refusing to package files that usually hold credentials: {shown}",
            field="source_dir",
            remedy="move them out of the source folder, or allow them explicitly if they are safe",
        )
    found.sort()
    _check_limits(found, limits)
    return found


def _check_limits(found: list[tuple[str, Path]], limits: PackageLimits) -> None:
    sizes = [(p.stat().st_size, rel) for rel, p in found]
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
                          check_secrets=False)
    return [(f"lib/cloudtrain/{rel}", path) for rel, path in files]


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


def build_package(source_dir: Path, limits: PackageLimits = PackageLimits()) -> Package:
    """Bundle ``source_dir`` into a temp file; nothing is written anywhere else."""
    user_files = collect_files(source_dir, limits=limits)
    bootstrap = resource_dir("entrypoints") / BOOTSTRAP_NAME
    members = [(BOOTSTRAP_NAME, bootstrap), *_runtime_files(), *((f"src/{rel}", p) for rel, p in user_files)]
    fd, tmp = tempfile.mkstemp(prefix="cloudtrain-bundle-", suffix=".tar.gz")
    os.close(fd)
    path = Path(tmp)
    try:
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                    compresslevel=_GZIP_LEVEL) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arcname, file in members:
                _add(tar, arcname, file)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    digest = _sha256_file(path)
    files = [{"path": rel, "size": p.stat().st_size} for rel, p in user_files]
    return Package(path=path, bootstrap=bootstrap, digest=f"sha256:{digest}", bundle_bytes=path.stat().st_size,
                   files=files)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            h.update(chunk)
    return h.hexdigest()
