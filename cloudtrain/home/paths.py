"""Where cloudtrain keeps its own state on the user's machine (job database, local object store, logs, temp
files)."""

from __future__ import annotations

import atexit
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudtrain import contract

_temp_dirs: dict[Path, Path] = {}  # home -> this process's temp folder in it


def cloudtrain_home() -> Path:
    """``$CLOUDTRAIN_HOME`` or ``~/.cloudtrain``; created on first use by whoever writes into it."""
    env = os.environ.get(contract.HOME)
    return Path(env).expanduser().resolve() if env else Path.home() / ".cloudtrain"


def temp_dir() -> Path:
    """This process's folder for cloudtrain's temp files (a bundle being built, a code folder to upload):
    ``<home>/tmp/<pid>-<start time>``, removed at exit. A process killed meanwhile (a CLI SIGKILLed while bundling)
    leaves its folder behind: the first call in any later process removes every folder whose process is gone."""
    from cloudtrain.home.procs import is_alive, start_ticks

    root = cloudtrain_home() / "tmp"
    if root in _temp_dirs and _temp_dirs[root].is_dir():
        return _temp_dirs[root]
    me = os.getpid()
    folder = root / f"{me}-{start_ticks(me) or 0}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.iterdir():
            pid, _, ticks = stale.name.partition("-")
            if pid.isdigit() and not is_alive(int(pid), int(ticks) if ticks.isdigit() and ticks != "0" else None):
                shutil.rmtree(stale, ignore_errors=True)
        folder.mkdir(exist_ok=True)
    except OSError as exc:  # a read-only or full home: its own message, not the project's
        from cloudtrain.home.errors import os_problem

        raise os_problem(exc, root, "make a temp folder for the bundle") from None
    if root not in _temp_dirs:
        atexit.register(shutil.rmtree, folder, True)
    _temp_dirs[root] = folder
    return folder


def default_store_uri() -> str:
    return (cloudtrain_home() / "store").as_uri()


def resource_dir(name: str) -> Path:
    """``entrypoints`` or ``templates``: inside the wheel (``cloudtrain/_<name>``) or beside a source checkout."""
    package_dir = Path(__file__).resolve().parent.parent  # cloudtrain/, above home/
    for candidate in (package_dir / f"_{name}", package_dir.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cloudtrain's {name}/ folder is missing from this installation; reinstall cloudtrain")


def derived(name: str, key: str, build: Callable[[], Any], use: Callable[[Any], Any] = lambda data: data) -> Any:
    """JSON data derived from installed files (a slice of an SDK's service model ...), kept in ``<home>/cache`` under
    ``name`` and the hash of ``key`` (what it was derived from, e.g. the SDK's files' stamps), so a plan does not
    parse a large file each time; returns ``use(data)``. Built afresh when the key changes, and when ``use`` refuses
    what the cache holds (another version's shape, a damaged file); a cache that cannot be read or written (a
    read-only home) only costs the build."""
    import hashlib
    import json

    from cloudtrain import safe_json

    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = cloudtrain_home() / "cache" / f"{name}-{digest}.json"
    try:
        return use(safe_json.load(path))  # a FIFO in its place is refused, not waited on
    except Exception:  # whatever a cache of another shape (or damaged) makes ``use`` raise: built again below
        pass
    data = build()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)  # a reader sees the whole file or none
    except OSError:
        tmp.unlink(missing_ok=True)
    return use(data)
