"""The types the core and every provider share, at the bottom of the client side: what a provider declares
(``Declaration``), what it can do (``Capability``), what a job is doing (``JobState``, ``JobStatus``), what a node
runs (``NodeCommand``), what it adds to a plan's summary (``Summary``) and what its doctor checks say (``Check``).

Plain data: it imports nothing of cloudtrain but the kernel below it (errors, handles), so a provider, the planner,
the registry and the faces all point down at it and never at each other. ``cloudtrain.providers.base`` and
``cloudtrain.registry`` re-export the names plugins import from there."""

from __future__ import annotations

import builtins
import enum
import importlib
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cloudtrain.errors import ProviderNotFound
from cloudtrain.handles import JobHandle

PLAIN_NODE = "cloudtrain.providers.local.node"  # cloudtrain's own node contract (CLOUDTRAIN_NNODES ...)


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"

    @property
    def terminal(self) -> bool:
        return self in {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}


class Capability(str, enum.Enum):
    """What a provider can do, declared in ``Provider.capabilities`` and checked before anything is sent: a plan
    (spot, several nodes, accelerators), ``resubmit`` (cloudtrain's recovery resubmits a preempted job) and
    ``preempt`` (``cloudtrain preempt`` rehearses a spot interruption)."""

    MULTI_NODE = "multi_node"  # a job of several nodes
    SPOT = "spot"  # preemptible capacity (spot, low priority, a preemptible partition)
    ACCELERATORS = "accelerators"  # GPUs (spec.accelerator)
    RESUBMIT = "resubmit"  # Provider._resubmit: an ended job submitted again from the definition the platform holds
    PREEMPT = "preempt"  # Provider._preempt: every node of a running job gets SIGTERM, as from the platform

    __hash__ = str.__hash__  # so "spot" in capabilities is also true (plugins written before the enum use strings)


# The keys of JobStatus.to_dict() that are typed fields: where a provider puts what the core reads.
TYPED = ("output_uri", "checkpoint_uri", "restarts", "max_restarts", "nodes", "restart_resumes", "recovery")
_ALWAYS = ("output_uri", "checkpoint_uri")  # shown as null when unknown; the others only when set


@dataclass
class JobStatus:
    """One job as its platform describes it. What the core reads is typed (below ``details``); ``details`` holds
    the platform's own facts (shown by ``status``, never read by the core). ``to_dict()`` (``-o json``) puts both
    in one flat object, as earlier releases did."""

    handle: JobHandle
    name: str
    state: JobState
    message: str = ""
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # -- read by the core ---------------------------------------------------------------------------------
    output_uri: str | None = None  # where the job's outputs are (`cloudtrain outputs`), as the platform holds it
    checkpoint_uri: str | None = None  # the store a restart resumes from (status says from which checkpoint)
    restarts: int | None = None  # restarts so far (the platform's, or cloudtrain's); None: not counted
    max_restarts: int | None = None  # what the spec allowed, as the platform holds it (recovery reads it)
    nodes: builtins.list[dict[str, Any]] | None = None  # per node: rank, pid, exit_code, outcome, log ...
    restart_resumes: str | None = None  # set by the CLI: what a restart would start from
    recovery: dict[str, Any] | None = None  # set by `wait --recover`: the chain of resubmissions
    # when the platform says the job entered its current state (cloudtrain's or the platform's own sub-state, e.g.
    # SageMaker's secondary status), epoch seconds; None where it does not say. The timeline dates a state change
    # there rather than when a status call happened to see it (cloudtrain/home/timeline.py)
    state_since: float | None = None

    def __post_init__(self) -> None:
        for key in TYPED:  # a provider written before these fields were typed put them in details
            if key in self.details:
                value = self.details.pop(key)
                if getattr(self, key) is None:
                    setattr(self, key, value)

    def facts(self) -> dict[str, Any]:
        """Everything known beyond state, message and times: the typed fields that are set, then details."""
        typed = {k: getattr(self, k) for k in TYPED if getattr(self, k) is not None or k in _ALWAYS}
        return {**typed, **self.details}

    def to_dict(self) -> dict[str, Any]:
        return {
            "handle": str(self.handle),
            "name": self.name,
            "state": self.state.value,
            "message": self.message,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            **({"state_since": self.state_since} if self.state_since is not None else {}),
            **self.facts(),
        }


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: the bootstrap command and environment, and the torchrun line it will derive."""

    rank: int
    argv: list[str]
    env: dict[str, str]
    torchrun: list[str]

    @property
    def nproc_per_node(self) -> int:
        """Processes on this node as it will run them (read off the torchrun line, the source of truth); 0 where
        only the node knows (one per GPU of a VM size the plan cannot see)."""
        value = self.torchrun[self.torchrun.index("--nproc-per-node") + 1]
        return int(value) if value.isdigit() else 0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "argv": self.argv, "env": self.env, "torchrun": self.torchrun}


@dataclass(frozen=True)
class Summary:
    """What a provider adds to a plan's summary (what its translation returns, or its ``plan_summary`` hook)."""

    where: str = ""  # the account-side place the job goes, e.g. "project p, region us-central1"
    instance: str = ""  # each node's machine when the catalog names none ("this machine")
    max_wait: int | None = None  # spot: the seconds the platform waits for capacity plus runs, default included


def where(*places: tuple[str, str | None]) -> str:
    """A "where" line from (what, value) pairs, e.g. ``where(("region", "us-east-1"))``: what a Summary holds."""
    return ", ".join(f"{what} {value}" for what, value in places if value)


@dataclass(frozen=True)
class Check:
    """One line of `cloudtrain doctor`: what a provider's checks return."""

    area: str  # "cloudtrain" or a provider's name
    name: str  # "extra", "credentials", "region", "torch" ...
    status: str  # "ok", "warn" or "missing"
    detail: str  # what was found (versions, names of variables and files; never a secret value)
    fix: str = ""  # the command or step that fixes it; "" when ok

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Declaration:
    """What a provider is and where its parts are. Roles are ``"module:attribute"`` (or ``"module"``) relative to
    ``package``; None: the provider has no such part."""

    name: str  # as in --provider, handles (name://...) and the spec's providers.<name>
    summary: str  # one line, shown in --help and doctor
    package: str  # the provider's folder, e.g. "cloudtrain.providers.aws"
    provider: str = "provider:Provider"  # the Provider subclass
    title: str = ""  # the platform's name in messages ("SageMaker"); default: the name
    extra: str = ""  # the pip extra that installs what it needs (pip install 'cloudtrain[<extra>]')
    requires: tuple[str, ...] = ()  # top-level modules that must be importable to use it
    distribution: str = "cloudtrain"  # whose extra that is (a plugin names its own distribution)
    options: str | None = None  # the pydantic model of the spec's providers.<name> block
    # environment variables per setting, first set wins: where `config` and the plan look after the spec
    env: dict[str, tuple[str, ...]] = field(default_factory=dict)
    settings: str | None = None  # fn(key[, setting]) -> (value, where) | None: the platform's own tools (gcloud, az
    #                               ...); setting(other_key) resolves another of its settings
    placeholders: dict[str, str] = field(default_factory=dict)  # setting -> what a plan shows while it is unset
    doctor: str | None = None  # fn(ctx) -> list[Check]
    node: str | None = None  # the node contract module (standard library only); None: cloudtrain's own
    platform: str | None = None  # the node contract's name, as ``--emulate`` takes it (default: the name)
    catalog: str | None = None  # a JSON file in the folder: machines and list prices
    instance_option: str | None = None  # the option that names a machine explicitly (for catalog messages)
    images: str | None = None  # a JSON file in the folder: the images its plans pick, dated
    torch_minors: str | None = None  # fn() -> torch minors it has an image for
    export: str | None = None  # module: export(plan, request, folder) -> files (`plan --export`); unset(plan)
    # -- the platform's naming rules (checked by the planner, Provider.resubmit and handle parsing) -----------
    name_pattern: str | None = None  # a regex every job name (plan.job_id, a resubmission's) matches in full
    name_rule: str = ""  # that rule in words, for the message when a name breaks it
    handle_scope: tuple[str, ...] = ()  # what a handle names before the job id: aws://<region>/<job> -> ("region",)
    # -- the plan summary and doctor (issue 32.3): what the core used to know about each platform --------------
    plan_summary: str | None = None  # fn(plan) -> plan.Summary: the "where" line, a machine the catalog can't
    #                                  name, the spot wait the platform will use
    cloud_vm: str | None = None  # fn() -> bool: this machine is one of the platform's VMs (firmware strings, no
    #                              network), so doctor says its own identity may supply credentials

    @property
    def platform_name(self) -> str:
        return self.platform or self.name

    def handle_form(self) -> str:
        """How this provider's handles look: ``aws://<region>/<job>``."""
        return f"{self.name}://" + "".join(f"<{part}>/" for part in self.handle_scope) + "<job>"

    def load(self, role: str) -> Any:
        """The object a role names (``doctor`` -> the checks function ...), imported now."""
        target = getattr(self, role)
        if target is None:
            raise LookupError(f"provider {self.name!r} declares no {role}")
        module, _, attr = target.partition(":")
        loaded = importlib.import_module(self._module(module))
        found = getattr(loaded, attr) if attr else loaded
        return self.checked(role, found, target)

    def checked(self, role: str, found: Any, where: str) -> Any:
        """``found`` when it has what its role's Protocol (``ROLES``) asks for; else a ProviderNotFound naming the
        provider, the role, where it points and what it lacks (a plugin's mistake, said when the role loads)."""
        protocol = ROLES.get(role)
        if protocol is None or isinstance(found, protocol):
            return found
        missing = [m for m in _members(protocol) if not hasattr(found, m)]
        raise ProviderNotFound(f"provider {self.name!r}: its {role} role ({where}) is not {protocol.__doc__}: it "
                               f"lacks {', '.join(missing)}", field="--provider",
                               remedy=f"fix {self.distribution}'s declaration or its {role} module, or uninstall it")

    def node_module(self) -> str:
        """The dotted name of the node contract module (what the bootstrap loads from the bundle's lib/)."""
        return self._module(self.node) if self.node else PLAIN_NODE

    def node_path(self) -> str:
        """The node contract's file under the bundle's lib/ (the bootstrap's ``--node-contract``)."""
        return self.node_module().replace(".", "/") + ".py"

    def node_file(self) -> Path:
        """The node contract's source file here (packaging ships a plugin's into the bundle's lib/)."""
        spec = importlib.util.find_spec(self.node_module())
        if spec is None or not spec.origin:
            raise ProviderNotFound(f"provider {self.name!r}: node contract {self.node_module()!r} is not importable")
        return Path(spec.origin)

    def data(self, role: str) -> Any:
        """A JSON file the provider ships in its folder (``catalog``, ``images``)."""
        name = getattr(self, role)
        if name is None:
            raise LookupError(f"provider {self.name!r} declares no {role}")
        return json.loads((self.folder() / name).read_text(encoding="utf-8"))

    def folder(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ProviderNotFound(f"provider {self.name!r}: package {self.package!r} is not importable")
        return Path(next(iter(spec.submodule_search_locations)))

    def _module(self, relative: str) -> str:
        return f"{self.package}.{relative}" if relative else self.package


# -- what each role a Declaration names must be, checked when it loads (Declaration.load) ------------------------

@runtime_checkable
class ProviderRole(Protocol):
    """a Provider subclass (cloudtrain.providers.base.Provider: _translate or _plan, _submit, _describe, _logs,
    _cancel, _list)"""

    def _submit(self, plan: Any) -> JobHandle: ...
    def _describe(self, handle: JobHandle) -> JobStatus: ...
    def _logs(self, handle: JobHandle, follow: bool) -> Any: ...
    def _cancel(self, handle: JobHandle) -> None: ...
    def _list(self, limit: int) -> list[JobStatus]: ...


@runtime_checkable
class OptionsRole(Protocol):
    """a pydantic model of the spec's providers.<name> block (model_validate, model_fields)"""

    model_fields: Any

    def model_validate(self, obj: Any) -> Any: ...


@runtime_checkable
class NodeRole(Protocol):
    """a node contract module (detect, planned, emulate)"""

    def detect(self, *args: Any, **kwargs: Any) -> Any: ...
    def planned(self, nodes: int, rank: int, job_id: str, machine_type: str) -> dict[str, str]: ...
    def emulate(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class ExportRole(Protocol):
    """an export module (export(plan, request, folder) -> files)"""

    def export(self, plan: Any, request: Any, folder: Path) -> list[Path]: ...


@runtime_checkable
class Hook(Protocol):
    """a function"""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


# settings: fn(key) -> (value, where) | None; doctor: fn(ctx) -> list[Check]; torch_minors: fn() -> minors;
# plan_summary: fn(plan) -> Summary; cloud_vm: fn() -> bool
ROLES: dict[str, type] = {"provider": ProviderRole, "options": OptionsRole, "node": NodeRole, "export": ExportRole,
                          "settings": Hook, "doctor": Hook, "torch_minors": Hook, "plan_summary": Hook,
                          "cloud_vm": Hook}


def _members(protocol: type) -> list[str]:
    """What a role's Protocol asks for, by name (its methods and attributes; ``__call__`` for a function)."""
    names = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
    return sorted(n for n in names if n == "__call__" or not (n.startswith("__") or n.startswith("_is_")
                                                               or n.startswith("_abc")))
