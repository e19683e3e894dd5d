"""Copies a rank's training state into host buffers that are allocated once and reused by every save: the only part
of a checkpoint that blocks training.

On a GPU the buffers are pinned and the copy runs on a side CUDA stream (ordered after the work already queued on
the training stream), so it moves at the link's speed (an H200: 55 GB/s, against 1.3 GB/s for a fresh ``.to("cpu")``
of each tensor, which is what ``dcp.async_save`` does without a stager). On CPU they are ordinary memory, copied into
in place. The pinned buffers are one copy of the rank's state in host memory; where the host cannot hold that (the
node's ranks together over ``HOST_SHARE`` of the memory available) or pinning fails, the Checkpointer falls back to
a fresh copy per save (``fresh_copy``) and logs why.

torch's ``DefaultStager`` (2.9+) does the same, but raised ``KeyError(<class 'type'>)`` in its deep copy for a plain
model + AdamW state dict under torch 2.11 (the H200 image), so this uses the helpers torch's own stager and
torchtitan's ``async_with_pinned_mem`` are built on (``_create_cpu_state_dict``/``_copy_state_dict``, torch >= 2.4).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

try:  # private helpers, present since torch 2.4; without them each save makes a fresh copy (fresh_copy)
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
except ImportError:  # pragma: no cover - older torch
    _copy_state_dict = _create_cpu_state_dict = None  # type: ignore[assignment]
try:  # what the copy raises for a state whose keys are not the buffers' (``layout`` makes new buffers first)
    from torch.distributed._state_dict_utils import CompanionMismatch
except ImportError:  # pragma: no cover - older torch
    class CompanionMismatch(Exception):  # type: ignore[no-redef]
        pass
# what the helpers raise for a state they refuse (a value of a type DCP does not save, a torch.dtype in a param
# group): the Checkpointer then makes a fresh copy per save, never a failed one
REFUSED = (ValueError, RuntimeError, KeyError, TypeError, CompanionMismatch)

HOST_SHARE = 0.8  # of MemAvailable the node's ranks may pin together


class StagingUnavailable(Exception):
    """Reused host buffers cannot be used here; the message says why (logged once, then torch's copy is used)."""


def tensors(state: Any) -> Iterator[torch.Tensor]:
    """The tensors in a (nested) state dict."""
    if isinstance(state, dict):
        for value in state.values():
            yield from tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from tensors(value)
    elif isinstance(state, torch.Tensor):
        yield state


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's own shard


def layout(state: Any) -> dict[tuple[Any, ...], Any]:
    """Every entry of a (nested) state, by its path: a tensor's (local) shape and dtype, and where the other values
    are. Buffers made for one layout take only a state of that layout: torch's copy into them casts another dtype,
    broadcasts another shape, and returns the training tensor itself where the buffers hold None, so the background
    write would read a later step's values."""
    return dict(_entries(state, ()))


def _entries(state: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(state, dict):
        for key, value in state.items():
            yield from _entries(value, (*path, key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from _entries(value, (*path, i))
    elif isinstance(state, torch.Tensor):
        if hasattr(state, "local_shards"):  # a ShardedTensor: its shards here
            yield path, tuple((tuple(s.tensor.shape), s.tensor.dtype) for s in state.local_shards())
        else:
            yield path, (type(state).__name__, tuple(_local(state).shape), state.dtype)
    else:
        yield path, None


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict, counting a DTensor's local shard only."""
    return sum(int(t.numel() * t.element_size()) for t in map(_local, tensors(state)))


def state_device(state: Any) -> torch.device:
    """Where a state's training tensors live: the GPU of any tensor on one, else the CPU."""
    return next((t.device for t in tensors(state) if t.device.type == "cuda"), torch.device("cpu"))


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def fresh_copy(state: Any) -> Any:
    """A copy of a (nested) state dict whose tensors are new host tensors, made for one save where the reused
    buffers cannot be. Never torch's own offload: before torch 2.9 ``dcp.async_save`` copies with
    ``tensor.to("cpu")``, which returns a CPU tensor itself, so the background write read what training changed
    after ``save()`` returned (a checkpoint holding parts of two steps)."""
    if isinstance(state, dict):
        return {key: fresh_copy(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        copied = [fresh_copy(value) for value in state]
        return copied if isinstance(state, list) else tuple(copied)
    if isinstance(state, torch.Tensor):  # a DTensor or ShardedTensor copies its local shards
        return state.to("cpu", copy=True)
    return copy.deepcopy(state)


class HostStager:
    """``stage(state)`` returns a copy of ``state`` whose tensors live in this stager's host buffers; the copy is
    complete when it returns. The buffers are reused by the next ``stage``: the caller must be done with the
    previous copy (the Checkpointer keeps at most one save in flight)."""

    def __init__(self, device: torch.device, log: Callable[[str], None],
                 local_ranks: int | None = None) -> None:
        if _create_cpu_state_dict is None or _copy_state_dict is None:
            raise StagingUnavailable(f"torch {torch.__version__} has no state-dict staging helpers (torch >= 2.4)")
        self.pin = device.type == "cuda"
        self.device = device
        self.log = log
        self.local_ranks = local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        self.buffers: dict[str, Any] | None = None
        self.made_for: dict[tuple[Any, ...], Any] = {}  # the layout of the state the buffers were made for
        self.stream: Any = torch.cuda.Stream(device) if self.pin else None
        self.allocated = 0

    def _allocate(self, state: dict[str, Any]) -> None:
        need = state_bytes(state)
        free = available_host_bytes()
        if free is not None and need * self.local_ranks > HOST_SHARE * (free + self.allocated * self.local_ranks):
            raise StagingUnavailable(
                f"the state takes {need / 1e9:.2f} GB per rank ({self.local_ranks} on this node) and the host has "
                f"{free / 1e9:.2f} GB available: reused {'pinned ' if self.pin else ''}buffers would not fit")
        self.buffers = None  # the old ones go before the new ones are made
        try:
            self.buffers = _create_cpu_state_dict(state, pin_memory=self.pin)
        except RuntimeError as exc:  # cudaHostAlloc refused (a pinned-memory limit, a container's memlock)
            raise StagingUnavailable(f"{need / 1e9:.2f} GB of pinned host memory could not be allocated ({exc})") \
                from exc
        self.allocated = need

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        shape = layout(state)
        if self.buffers is None or shape != self.made_for:  # the first save, or the layout changed since (a
            self._allocate(state)                             # buffer registered, a param group added, a dtype)
            self.made_for = shape
        return self._copy(state)

    def _copy(self, state: dict[str, Any]) -> dict[str, Any]:
        assert self.buffers is not None
        if self.stream is None:
            return _copy_state_dict(state, self.buffers, non_blocking=False)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # after the step that made the tensors
        with torch.cuda.stream(self.stream):
            staged = _copy_state_dict(state, self.buffers, non_blocking=True)
        self.stream.synchronize()  # the buffers are whole; training may change the tensors from here on
        return staged

    def close(self) -> None:
        self.buffers = None
        self.allocated = 0
