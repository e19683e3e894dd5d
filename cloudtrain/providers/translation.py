"""What the planner hands a provider and what the provider hands back (issue 39.1): the core assembles every plan,
a provider translates it.

The planner (cloudtrain/plan/planner.py) resolves one ``PlanContext`` for the chosen provider: the spec with every
``providers.<name>`` setting filled once (through the one resolver, cloudtrain.spec.settings), the package, and the
settings as the platform's own tools add to them. The provider's ``_translate(ctx)`` returns a ``Translation``: the
platform request and what the nodes run, where the bundle goes, the machine and runtime, its own notes. The planner
then builds the Plan and adds the checks, the estimate, the budget and the shared notes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cloudtrain import registry
from cloudtrain.job_types import Declaration, NodeCommand

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.platforms.catalog import Machine
    from cloudtrain.platforms.images import Runtime
    from cloudtrain.spec.model import JobSpec


@dataclass
class PlanContext:
    """One plan's inputs, resolved by the planner for one provider."""

    provider: str
    spec: JobSpec  # every providers.<provider> setting the spec leaves unset filled from the environment or profile
    package: Package
    contract: Declaration  # whose node contract the nodes run under (the provider's; local: the emulated one's)
    # key -> (the value the spec, environment, profile, the platform's tools or the default give, or None; where it
    # came from: "default" for cloudtrain's own; the plan note for a setting found nowhere): the planner's resolver,
    # asked at most once per key
    resolve: Callable[[str], tuple[Any, str, str]]
    _found: dict[str, tuple[Any, str, str]] = field(default_factory=dict, repr=False)

    def setting(self, key: str) -> Any:
        """``providers.<provider>.<key>`` as the plan uses it: the spec's, else the environment's, the profile's or
        the platform's own tools' (gcloud, az, ~/.kube/config), else its default; None when none sets it."""
        return self._resolved(key)[0]

    def chosen(self, key: str) -> Any:
        """The setting where someone set it (the spec, the environment, the profile, the platform's tools); None
        where only cloudtrain's default is left (the provider says which it uses)."""
        value, source, _ = self._resolved(key)
        return None if source == "default" else value

    def staged(self, key: str, placeholder: str, notes: list[str]) -> str:
        """A setting the plan cannot do without (a bucket, a role, a staging folder): its value, else
        ``placeholder`` with the note naming every place it could come from added to ``notes`` (submit refuses a
        plan that still holds the placeholder)."""
        value = self.setting(key)
        if value:
            return str(value)
        notes.append(self._resolved(key)[2])
        return placeholder

    def node_commands(self, spec: JobSpec, *, job_id: str, python: str, bootstrap: str, args: list[str],
                      env: dict[str, str], machine_type: str = "",
                      seen: Callable[[int], dict[str, str]] | None = None) -> list[NodeCommand]:
        """Every node's command, sent ``env``, with the torchrun line the node derives from what the platform gives
        node N: the contract's ``planned`` variables (``seen(N)`` where the provider knows better, e.g. a local
        emulation's loopback rendezvous)."""
        from cloudtrain.platforms.node_commands import node_command

        module = registry.node_contract(self.contract.name)
        nodes = []
        for rank in range(spec.nodes):
            view = seen(rank) if seen else module.planned(spec.nodes, rank, job_id, machine_type)
            nodes.append(node_command(rank, python, bootstrap, args, env, view, module, job_id))
        return nodes

    def _resolved(self, key: str) -> tuple[Any, str, str]:
        if key not in self._found:
            self._found[key] = self.resolve(key)
        return self._found[key]


@dataclass
class Translation:
    """What a provider's ``_translate`` returns: the platform request for the context's job, and what the plan shows
    beside it. The planner makes it a Plan."""

    job_id: str
    spec: JobSpec  # the spec as the platform runs it (with the output and checkpoint locations it derived)
    request: dict[str, Any]
    nodes: list[NodeCommand]
    staging: dict[str, str] = field(default_factory=dict)  # where the bundle and bootstrap go
    notes: list[str] = field(default_factory=list)  # the provider's own notes
    machine: Machine | None = None
    image: str | None = None
    runtime: Runtime | None = None
    estimate: dict[str, Any] | None = None  # only where the catalog cannot price it (a cluster's own machines)


class Planned(Protocol):
    """A plan as a provider reads it when it submits or exports one (cloudtrain.plan.model.Plan is one): the
    providers sit below the plan room, so they name what they read, not the class."""

    provider: str
    job_id: str
    spec: JobSpec
    package: Package
    request: dict[str, Any]
    nodes: list[NodeCommand]
    staging: dict[str, str]
    notes: list[str]
    image: str | None
    machine: Machine | None
    runtime: Runtime | None

    def to_dict(self, redact: bool = True) -> dict[str, Any]: ...
