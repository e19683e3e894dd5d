"""Did each rank join a process group? Written by every worker, read by its node's bootstrap.

A script that never initialises torch.distributed (or whose framework fell back to one process) still exits 0 on
every rank, and "succeeded" would hide that each rank trained alone. The bundle's ``sitecustomize`` calls
:func:`install` in every process; in a torchrun worker of a cloudtrain node (torchrun sets ``TORCHELASTIC_RUN_ID``
for its workers only, and the bootstrap names a folder in ``CLOUDTRAIN_RANK_REPORTS``) it writes
``rank-<RANK>.json`` there: the size of the default process group when one is created, or ``joined: 0`` at exit
when none was.

Nothing happens at start-up beyond adding one import hook: ``torch.distributed.distributed_c10d`` is patched when it
is imported (if ever). The hook wraps ``_update_default_pg``, the function every way of creating the default group
goes through (``init_process_group`` however it was imported, ``init_device_mesh``, Accelerate, Lightning), so a
group that was created and destroyed before exit still counts. Standard library only.
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "CLOUDTRAIN_RANK_REPORTS"
C10D = "torch.distributed.distributed_c10d"

_state: dict[str, Any] = {"folder": None, "owner": None, "written": False, "patched": False}


def install() -> None:
    """In a torchrun worker of a cloudtrain node: watch for the default process group, report at exit. The variable
    is taken out of the environment, so this process's own children (DataLoader workers, a DCP saver, subprocesses)
    are never counted as ranks; torchrun's own process (which may have a ``RANK`` of the platform's, as on Azure ML)
    leaves it for its workers."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "RANK" not in os.environ or not os.environ.get(ENV):
        return
    if _state["owner"] is not None:
        return
    _state.update(folder=os.environ.pop(ENV), owner=os.getpid())
    if C10D in sys.modules:  # imported before us (not by a plain worker): patch it now
        _patch(sys.modules[C10D])
    else:
        sys.meta_path.insert(0, _PatchOnImport())
    atexit.register(_at_exit)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when torch imports distributed_c10d, wraps the real loader so the module is patched
    right after it ran (before ``torch.distributed`` re-exports its names)."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != C10D:
            return None
        sys.meta_path.remove(self)  # one module, once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.inner  # the module looks as if we had never been here
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        _patch(module)


def _patch(c10d: ModuleType) -> None:
    original = getattr(c10d, "_update_default_pg", None)
    if not callable(original):  # a torch without it: say nothing rather than guess
        return

    def _update_default_pg(pg: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(pg, *args, **kwargs)
        if pg is not None:
            try:
                _write(pg.size(), c10d.get_backend(pg))
            except Exception:  # never disturb training for a report
                _write(None, None)
        return result

    c10d._update_default_pg = _update_default_pg  # type: ignore[attr-defined]
    _state["patched"] = True


def _at_exit() -> None:
    if _state["written"] or os.getpid() != _state["owner"]:
        return
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            _write(dist.get_world_size(), str(dist.get_backend()))
            return
    except Exception:
        pass
    # torch.distributed imported but our hook never ran on it: a group may have come and gone unseen
    _write(None if dist is not None and not _state["patched"] else 0, None)


def _write(joined: int | None, backend: str | None) -> None:
    """``joined``: the default group's size, 0 for none, None where this process cannot tell."""
    if os.getpid() != _state["owner"] or _state["written"]:
        return
    rank = os.environ.get("RANK", "?")
    report = {"rank": rank, "local_rank": os.environ.get("LOCAL_RANK"), "world_size": _int(os.environ.get(
        "WORLD_SIZE")), "joined": joined, "backend": backend, "pid": os.getpid()}
    try:
        folder = Path(_state["folder"])
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".rank-{rank}.json.tmp"
        tmp.write_text(json.dumps(report))
        os.replace(tmp, folder / f"rank-{rank}.json")
        _state["written"] = joined is not None or _state["written"]
    except OSError:
        pass


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


# -- the node's side: read what its workers wrote ------------------------------------------------------------


def summarize(folder: Path) -> dict[str, Any] | None:
    """What this node's workers reported: how many ran, how many trained alone (no group, or a group of one while
    the job's world is larger), and the world size they were started in. None if no worker reported."""
    reports = []
    for path in sorted(folder.glob("rank-*.json")) if folder.is_dir() else []:
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    if not reports:
        return None
    world = max((r.get("world_size") or 0 for r in reports), default=0)
    known = [r for r in reports if isinstance(r.get("joined"), int)]
    return {
        "ran": len(reports),
        "world_size": world,
        "no_group": sum(1 for r in known if r["joined"] == 0),
        "group_of_one": sum(1 for r in known if r["joined"] == 1 and world > 1),
        "joined": sorted({r["joined"] for r in known if r["joined"] > 1}),
        "unknown": len(reports) - len(known),
    }


def alone_text(ran: int, no_group: int, group_of_one: int, world_size: int) -> str | None:
    """The plain sentence for processes that trained alone in a job meant to be distributed, or None."""
    alone = no_group + group_of_one
    if world_size <= 1 or not alone:
        return None
    processes = f"{ran} process{'es' if ran != 1 else ''} ran"
    if alone < ran:
        return f"{processes}, {alone} of them outside the job's process group (world size {world_size})"
    if group_of_one == 0:
        return f"{processes}, none joined a process group: each trained alone"
    return f"{processes}, none joined the job's process group (world size {world_size}): each trained alone"
