"""Where cloudtrain keeps its own state on the user's machine (job database, local object store, logs)."""

from __future__ import annotations

import os
from pathlib import Path


def cloudtrain_home() -> Path:
    """``$CLOUDTRAIN_HOME`` or ``~/.cloudtrain``; created on first use by whoever writes into it."""
    env = os.environ.get("CLOUDTRAIN_HOME")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cloudtrain"


def default_store_uri() -> str:
    return (cloudtrain_home() / "store").as_uri()


def resource_dir(name: str) -> Path:
    """``entrypoints`` or ``templates``: inside the wheel (``cloudtrain/_<name>``) or beside a source checkout."""
    package_dir = Path(__file__).resolve().parent
    for candidate in (package_dir / f"_{name}", package_dir.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cloudtrain's {name}/ folder is missing from this installation; reinstall cloudtrain")
