"""The schema of each timeline event kind (pydantic, as the spec's): what cloudtrain/home/event_schema.py screens every
event with before a figure is made of it. Strict: ``true`` is not a step, ``"1"`` is not a number; finite, and
durations and counts never negative."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

TEN_YEARS = 10 * 365 * 86400.0  # no duration of a job is longer

Seconds = Annotated[float, Field(ge=0, le=TEN_YEARS, allow_inf_nan=False, strict=True)]
Count = Annotated[int, Field(ge=0, le=2 ** 53, strict=True)]
Text = Annotated[str, Field(max_length=10_000, strict=True)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow")

    e: Text
    t: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
    node: Count | Annotated[str, Field(max_length=200, strict=True)] | None = None  # the log's tag (timeline.py)


class _Step(_Event):
    step: Count
    total: Annotated[int, Field(ge=1, le=2 ** 53, strict=True)] | None = None
    data_s: Seconds | None = None


class _Checkpoint(_Event):
    step: Count | None = None
    bytes: Count | None = None
    blocked_s: Seconds | None = None
    publish_s: Seconds | None = None
    save_s: Seconds | None = None


class _TrainingAgain(_Event):
    step: Count
    after_restore_s: Seconds | None = None
    load_s: Seconds | None = None


class _Restored(_Event):
    step: Count | None = None
    bytes: Count | None = None
    seconds: Seconds | None = None


class _NodeStarted(_Event):
    rank: Count | None = None
    nodes: Count | None = None
    attempt: Count | None = None


class _Submitted(_Event):
    checkpoint_interval_s: Count | None = None
    nodes: Count | None = None


class _Ended(_Event):
    ended_at: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)] | None = None


class _Restarted(_Event):
    restarts: Count | None = None


class _Preempted(_Event):
    attempt: Count | None = None


class _Said(_Event):
    text: Text | None = None


MODELS: dict[str, type[_Event]] = {
    "step": _Step, "checkpoint": _Checkpoint, "training_again": _TrainingAgain, "restored": _Restored,
    "node_started": _NodeStarted, "submitted": _Submitted, "ended": _Ended, "restarted": _Restarted,
    "preempted": _Preempted, "checkpoint_dir_empty": _Said}


def model_of(kind: str) -> type[_Event]:
    """The schema of ``kind`` (a kind without one of its own: the fields every event has)."""
    return MODELS.get(kind, _Event)
