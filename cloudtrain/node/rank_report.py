"""Did each rank take part in the job's process group? Written by every worker, read by its node's bootstrap.

A script that never initialises torch.distributed, or whose framework falls back to one process (Accelerate on a
CPU machine without ``ACCELERATE_USE_CPU`` creates the group, then runs as ``DistributedType.NO`` and never
communicates over it), still exits 0 on every rank, and "succeeded" would hide that each rank trained alone. The
bundle's ``sitecustomize`` calls :func:`install` in every process; in a torchrun worker of a cloudtrain node
(torchrun sets ``TORCHELASTIC_RUN_ID`` for its workers only, and the bootstrap names a folder in
``CLOUDTRAIN_RANK_REPORTS``) it writes ``rank-<RANK>.json`` there: the size of the default process group it joined
(0: none), and how many collectives ran over its groups (each group's sequence number, which counts every
collective, DDP's gradient all-reduces included).

Nothing happens at start-up beyond adding one import hook: ``torch.distributed.distributed_c10d`` is patched when it
is imported (if ever). The hook wraps ``_update_default_pg``, which every way of creating the default group goes
through (``init_process_group`` however it was imported, ``init_device_mesh``, Accelerate, Lightning) and which
``destroy_process_group`` calls while the groups can still be counted. Standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any

from cloudtrain import contract

if TYPE_CHECKING:  # every worker imports this module: nothing beyond what Python has loaded already
    from collections.abc import Sequence
    from pathlib import Path
    from types import ModuleType

ENV = contract.RANK_REPORTS
C10D = "torch.distributed.distributed_c10d"
# Frameworks that run each process alone when set up for fewer processes than torchrun started: a hollow run's fix
# is theirs (diagnosis.py), so a report says which of them the worker had imported.
FRAMEWORKS = ("accelerate", "lightning", "pytorch_lightning")

_state: dict[str, Any] = {"folder": None, "owner": None, "patched": False, "report": None, "destroyed": 0}


def install() -> None:
    """In a torchrun worker of a cloudtrain node: watch the default process group, report at exit. The variable is
    taken out of the environment, so this process's own children (DataLoader workers, a DCP saver, subprocesses)
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


class _PatchOnImport:  # a meta path finder (importlib.abc would import importlib.resources, tempfile ...)
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


class _PatchingLoader:
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
        if pg is None:  # destroy_process_group: the groups are still there to count
            with contextlib.suppress(Exception):  # never disturb training for a report
                _record(collectives=_counted(_collectives(c10d), keep=True))
        result = original(pg, *args, **kwargs)
        if pg is not None:
            with contextlib.suppress(Exception):
                _record(joined=pg.size(), backend=str(c10d.get_backend(pg)))
        return result

    c10d._update_default_pg = _update_default_pg  # type: ignore[attr-defined]
    _state["patched"] = True


def _collectives(c10d: Any) -> int | None:
    """Collectives run so far over this process's current groups (None where this torch cannot tell)."""
    try:
        return sum(int(pg._get_sequence_number_for_group()) for pg in list(c10d._world.pg_map))
    except Exception:
        return None


def _counted(now: int | None, keep: bool = False) -> int | None:
    """``now`` plus the collectives of groups destroyed earlier in this process; ``keep``: remember the total
    (the current groups are being destroyed)."""
    if now is None:
        return None
    total = now + _state.get("destroyed", 0)
    if keep:
        _state["destroyed"] = total
    return total


def _at_exit() -> None:
    c10d = sys.modules.get(C10D)
    with contextlib.suppress(Exception):
        if c10d is not None and c10d.is_initialized():  # still joined: count now
            _record(joined=c10d.get_world_size(), collectives=_counted(_collectives(c10d)))
            return
    if _state["report"] is None:  # never joined; unless a group came and went where our hook could not see it
        _record(joined=None if c10d is not None and not _state["patched"] else 0, collectives=0)


def _record(**fields: Any) -> None:
    """Update this rank's report and write it (atomically): at join, at destroy and at exit. ``joined``: the
    default group's size, 0 for none, None where this process cannot tell."""
    if os.getpid() != _state["owner"]:
        return
    report = _state["report"] or {"rank": os.environ.get("RANK", "?"), "local_rank": os.environ.get("LOCAL_RANK"),
                                   "world_size": _int(os.environ.get("WORLD_SIZE")), "joined": None,
                                   "collectives": None, "backend": None, "pid": os.getpid()}
    report.update(fields)
    report["frameworks"] = [name for name in FRAMEWORKS if name in sys.modules]
    _state["report"] = report
    import json

    folder = _state["folder"]
    tmp = os.path.join(folder, f".rank-{report['rank']}.json.tmp")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(json.dumps(report))
        os.replace(tmp, os.path.join(folder, f"rank-{report['rank']}.json"))
    except OSError:  # a full disk: the previous report stands (the node reads no report as "cannot tell")
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # not left behind half-written


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


# -- the node's side: read what its workers wrote ------------------------------------------------------------


def summarize(folder: Path) -> dict[str, Any] | None:
    """What this node's workers reported: how many ran, the world size they were started in, and how many trained
    alone: no group (``no_group``), a group of one in a larger world (``group_of_one``), or the job's group with
    not one collective run over it (``silent``). None if no worker reported."""
    from cloudtrain import safe_json

    reports = []
    for path in sorted(folder.glob("rank-*.json")) if folder.is_dir() else []:
        try:
            report = safe_json.load(path)
        except (OSError, ValueError):  # gone meanwhile, or safe_json.UnreadableJson: that rank did not report
            continue
        if isinstance(report, dict):  # a file of another shape: not a report either
            reports.append(report)
    if not reports:
        return None
    world = max((r["world_size"] for r in reports if _whole(r.get("world_size"))), default=0)
    known = [r for r in reports if isinstance(r.get("joined"), int)]
    return {
        "ran": len(reports),
        "world_size": world,
        "no_group": sum(1 for r in known if r["joined"] == 0),
        "group_of_one": sum(1 for r in known if r["joined"] == 1 and world > 1),
        "silent": sum(1 for r in known if r["joined"] > 1 and r.get("collectives") == 0),
        "joined": sorted({r["joined"] for r in known if r["joined"] > 1}),
        "unknown": len(reports) - len(known),
        "frameworks": sorted({name for r in reports if isinstance(r.get("frameworks"), list)
                              for name in r["frameworks"] if isinstance(name, str)}),
    }


def alone_text(summary: dict[str, int]) -> str | None:
    """The plain sentence for processes that trained alone in a job meant to be distributed, or None. ``summary``:
    :func:`summarize`'s counts (summed over nodes for a whole job)."""
    ran, world = summary.get("ran", 0), summary.get("world_size", 0)
    kinds = {kind: summary.get(kind, 0) for kind in ("no_group", "group_of_one", "silent")}
    alone = sum(kinds.values())
    if world <= 1 or not alone:
        return None
    processes = f"{ran} process{'es' if ran != 1 else ''} ran"
    if alone < ran:
        return f"{processes}, {alone} of them outside the job's process group (world size {world})"
    if kinds["no_group"] == ran:
        return f"{processes}, none joined a process group: each trained alone"
    if kinds["silent"] == ran:
        return (f"{processes} and joined a process group of {world}, but none communicated over it (no collective "
                "ran; a framework that fell back to one process?): each trained alone")
    return f"{processes}, none took part in the job's process group (world size {world}): each trained alone"
