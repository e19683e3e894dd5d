"""``providers.toy`` in a job spec: the toy scheduler's queue and a job's priority there."""

from __future__ import annotations

from pydantic import Field

from cloudtrain.spec.fields import Settings


class ToyOptions(Settings):
    queue: str | None = Field(None, description="The queue a job waits in (required to submit)")
    priority: int = Field(5, ge=0, le=9, description="Higher runs first")
