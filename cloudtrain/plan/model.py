"""A Plan is pure data: what a provider would send, and what each node would run. Printable, JSON-serialisable.
(Its text, ``print(plan)``, and its notebook view are attached from above, by cloudtrain/show/formatting.py and
cloudtrain/show/reprs.py: nothing here points up at them.)"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.job_types import NodeCommand

__all__ = ["NodeCommand", "Plan"]  # NodeCommand lives in cloudtrain.job_types

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.platforms.catalog import Machine
    from cloudtrain.platforms.images import Runtime
    from cloudtrain.spec.model import JobSpec


@dataclass(repr=False)
class Plan:
    """What a provider would send for a spec. ``print(plan)`` shows the summary `cloudtrain plan` prints and
    ``plan.to_dict()`` the whole document (`plan -o json`)."""

    provider: str
    job_id: str
    spec: JobSpec
    package: Package
    request: dict[str, Any]
    nodes: list[NodeCommand]
    staging: dict[str, str] = field(default_factory=dict)  # where the bundle and bootstrap go
    notes: list[str] = field(default_factory=list)
    image: str | None = None  # the container image (or Azure ML environment) every node runs
    machine: Machine | None = None  # each node's machine (None: this computer, or a cluster cloudtrain can't see)
    estimate: dict[str, Any] | None = None  # what it may cost, from the catalog's list prices (the planner adds it)
    budget: dict[str, Any] | None = None  # what max_cost buys (cloudtrain.plan.cost.plan_budget); None: no max_cost
    runtime: Runtime | None = None  # the torch and Python every node runs (None: this machine's own)
    spec_file: str | None = None  # the spec file the job's settings started from (None: flags or Python only)
    created_at: float = field(default_factory=time.time)  # a saved plan is good for a day (cloudtrain.plan.saved)

    @property
    def nproc_per_node(self) -> int:
        return self.nodes[0].nproc_per_node

    def __repr__(self) -> str:
        return (f"<Plan {self.provider} {self.job_id}: {self.spec.nodes} node(s) x {self.nproc_per_node} process(es), "
                f"package {self.package.digest[:19]}>")

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.package.close()

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """The plan as printed and recorded: secret-looking values masked (``redact=False`` only to execute it)."""
        from cloudtrain.node.secret_values import redact as mask

        data = {
            "provider": self.provider,
            "job_id": self.job_id,
            "created_at": self.created_at,
            "spec_file": self.spec_file,
            "request": self.request,
            "package": self.package.manifest(),
            "staging": self.staging,
            "image": self.image,
            "runtime": self.runtime.to_dict() if self.runtime else None,
            "machine": self.machine.to_dict() if self.machine else None,
            "estimate": self.estimate,
            "nodes": [n.to_dict() for n in self.nodes],
            # max_idle even at its default: every plan shows whether the hang watchdog is on
            "spec": {**self.spec.model_dump(mode="json", exclude_defaults=True),
                     "max_idle": self.spec.model_dump(mode="json", include={"max_idle"})["max_idle"]},
            "notes": self.notes,
        }
        if self.budget is not None:  # only with max_cost: plans saved before it existed read the same
            data["budget"] = self.budget
        if not redact:
            return data
        from cloudtrain.plan.seal import SEAL, seal_parts

        shown = mask(data)
        return {**shown, SEAL: seal_parts(shown)}  # `submit --plan` refuses a saved plan changed since
