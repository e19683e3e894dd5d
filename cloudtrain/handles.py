"""Job handles are URLs: ``local://<id>``, ``aws://<region>/<job>``,
``azure://<subscription>/<resource group>/<workspace>/<job>``, ``gcp://<project>/<region>/<job>``. They are parsed
and printed here and nowhere else."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cloudtrain.errors import HandleError

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class JobHandle:
    provider: str
    job_id: str
    scope: tuple[str, ...] = ()  # region, workspace, project ... whatever the provider needs to find the job

    def __str__(self) -> str:
        return f"{self.provider}://" + "/".join((*self.scope, self.job_id))

    @classmethod
    def parse(cls, text: str) -> JobHandle:
        provider, sep, rest = text.partition("://")
        parts = rest.strip("/").split("/") if rest else []
        if not sep or not re.match(r"^[a-z][a-z0-9_-]*$", provider) or not parts:
            raise HandleError(
                f"{text!r} is not a job handle",
                remedy="use the handle printed by `cloudtrain submit`, e.g. local://train-20260101-120000-ab12 "
                "(`cloudtrain list` shows them)",
            )
        for part in parts:
            if not _SEGMENT.match(part):
                raise HandleError(f"{text!r} has an invalid segment {part!r}",
                                  remedy="copy the handle exactly as `cloudtrain list` prints it")
        return cls(provider=provider, job_id=parts[-1], scope=tuple(parts[:-1]))
