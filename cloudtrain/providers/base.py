"""The provider interface, shaped plan-first.

``plan`` is pure (no network, no credentials, no mutation); ``submit`` only executes a plan. Public methods live
here and call small ``_hooks`` in each provider, so checks and derived operations (``wait``) are written once.
"""

from __future__ import annotations

import builtins
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from cloudtrain.errors import CapacityError, CloudtrainError, HandleError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import TYPED, Capability, Declaration, JobState, JobStatus
from cloudtrain.naming import check_job_name

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package
    from cloudtrain.providers.translation import PlanContext, Planned, Translation
    from cloudtrain.spec.model import JobSpec

# what plugins import from here (the types live in cloudtrain.job_types)
__all__ = ["TYPED", "Capability", "JobState", "JobStatus", "Provider"]


class _ByName:
    """``Provider.declaration`` of a provider class that states only a ``name`` (the older form): the registry's."""

    def __get__(self, obj: object, owner: type[Provider]) -> Declaration:
        find = Provider.declared
        assert find is not None, "cloudtrain.providers wires the registry's lookup in"
        return find(owner.name)


class Provider(ABC):
    """A platform, plan-first. A subclass states its declaration (``declaration = PROVIDER``, from its folder's
    ``__init__.py``); its ``name`` is the declaration's."""

    declaration: ClassVar[Declaration] = _ByName()  # type: ignore[assignment]
    name: ClassVar[str]  # = declaration.name, set for each subclass
    # Declared up front and checked at plan time, so a spec never reaches a platform that cannot honour it.
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    poll_seconds: float = 5.0  # between status checks while waiting (a cloud's API has rate limits)
    # How the platform words a job that ended because capacity or quota ran out (in its message or failure
    # reason), as regexes: a fallback list then moves the job on. A refusal at submit is a CapacityError.
    capacity_patterns: ClassVar[tuple[str, ...]] = ()
    # providers.<name>.<key> outside a plan (list, describe, submit), as a plan resolves it: the one resolver
    # (cloudtrain.spec.settings), wired in by cloudtrain.providers; a plan's settings come in its PlanContext
    settings_resolver: ClassVar[Callable[[str, str, Any], Any] | None] = None
    # What the core does around every submit and describe, installed from above so this interface names no room
    # over it: cloudtrain.plan installs the submitter (every plan comes from there), cloudtrain.providers the
    # timeline's observation of each status.
    around_submit: ClassVar[Callable[[Provider, Planned], JobHandle] | None] = None
    observe: ClassVar[Callable[[JobStatus], None] | None] = None
    # the registry's declaration of a provider by name (for a class that states only its name), wired in by
    # cloudtrain.providers: the registry sits above this interface's types
    declared: ClassVar[Callable[[str], Declaration] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("declaration")
        if declared is not None:
            if cls.__dict__.get("name", declared.name) != declared.name:
                raise TypeError(f"{cls.__name__}.name {cls.__dict__['name']!r} differs from its declaration's "
                                f"{declared.name!r}: state the name once, in the declaration")
            cls.name = declared.name
        try:  # strings are accepted (plugins written before the enum); anything else is a mistake, said now
            cls.capabilities = frozenset(Capability(c) for c in cls.capabilities)
        except ValueError as exc:
            raise TypeError(f"{cls.__name__}.capabilities: {exc}; one of "
                            f"{', '.join(c.value for c in Capability)}") from None

    # -- public template methods ------------------------------------------------------------------------
    def submit(self, plan: Planned) -> JobHandle:
        """Execute a plan, with what the core does around every submit (cloudtrain/plan/submitter.py: a plan still
        holding a placeholder refused before anything is staged or sent, then the cost and timeline records)."""
        if plan.provider != self.name:
            raise UserError(f"this plan is for provider {plan.provider!r}, not {self.name!r}",
                            remedy=f"plan the job again with provider {self.name!r}")
        around = Provider.around_submit
        if around is None:
            raise RuntimeError("cloudtrain.plan is not loaded: a plan comes from cloudtrain.plan.planner.plan_job or "
                               "cloudtrain.plan.saved")
        return around(self, plan)

    def describe(self, handle: JobHandle) -> JobStatus:
        status = self._describe(self._own(handle))
        if Provider.observe is not None:
            Provider.observe(status)  # a new platform state, a restart, the end: into the job's timeline
        return status

    def logs(self, handle: JobHandle, follow: bool = False) -> Iterator[str]:
        return self._logs(self._own(handle), follow)

    def cancel(self, handle: JobHandle) -> JobStatus:
        """Ask the job to stop. Cancelling a job that already ended changes nothing."""
        status = self.describe(handle)
        if status.state.terminal:
            return status
        self._cancel(handle)
        return self.describe(handle)

    def list(self, limit: int = 50) -> builtins.list[JobStatus]:
        return self._list(limit)

    def resubmit(self, handle: JobHandle, new_name: str) -> JobHandle:
        """Submit an ended job again as ``new_name``, from the definition the platform holds (same bundle,
        checkpoint URI and environment), so it resumes from its newest checkpoint. Nothing is read from local disk:
        a laptop that never saw the first submit can recover the job. A job already named ``new_name`` that is a
        resubmission of ``handle`` is returned as is (the call was retried)."""
        if Capability.RESUBMIT not in self.capabilities:
            raise UserError(f"provider {self.name!r} cannot resubmit jobs",
                            remedy="submit the same spec again; it resumes from checkpoint.uri")
        check_job_name(self.name, new_name, self.declaration.name_pattern, self.declaration.name_rule)
        return self._resubmit(self._own(handle), new_name)

    def capacity_error(self, error: BaseException | JobStatus) -> str | None:
        """Why this refusal (an exception from ``submit``/``resubmit``) or this ended job means that capacity or
        quota ran out on this provider and region, so a fallback list moves on; None: it does not."""
        if isinstance(error, CapacityError):
            return error.message
        if isinstance(error, JobStatus) and error.state in (JobState.PREEMPTED, JobState.FAILED):
            text = " ".join(str(t) for t in (error.message, error.details.get("failure_reason")) if t)
            if any(re.search(p, text, re.IGNORECASE) for p in self.capacity_patterns):
                return text
        return None

    def preempt(self, handle: JobHandle) -> JobStatus:
        """Rehearse a spot interruption of a running job (where declared: ``Capability.PREEMPT``): every node gets
        SIGTERM as from the platform; the job restarts where it has restarts left, else it ends preempted."""
        if Capability.PREEMPT not in self.capabilities:
            raise UserError(f"provider {self.name!r} cannot be preempted on request",
                            remedy="`cloudtrain preempt` rehearses spot interruptions on local jobs")
        return self._preempt(self._own(handle))

    def wait(self, handle: JobHandle, timeout: float | None = None, poll: float = 1.0,
             on_poll: Callable[[JobStatus], None] | None = None) -> JobStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.describe(handle)
            if status.state.terminal:
                return status
            if on_poll:
                on_poll(status)
            if deadline is not None and time.monotonic() >= deadline:
                raise CloudtrainError(f"{handle} still {status.state.value} after {timeout:.0f}s",
                                      remedy="wait longer (--timeout) or check `cloudtrain logs`")
            time.sleep(poll)

    def setting(self, key: str, explicit: Any = None) -> Any:
        """``providers.<name>.<key>``: ``explicit`` (the spec's), else the environment, the profile, the platform's
        own tools; None when none sets it. For what a provider does outside a plan (a plan asks its context)."""
        resolver = Provider.settings_resolver
        assert resolver is not None, "cloudtrain.providers wires the settings resolver in"
        return resolver(self.name, key, explicit)

    # -- what every provider's plan shares ---------------------------------------------------------------
    def contract(self, spec: JobSpec) -> Declaration:
        """The provider whose node contract this job's nodes run under: this one's (local: the emulated one's)."""
        return self.declaration

    @staticmethod
    def processes(spec: JobSpec, gpus: int | None) -> int | None:
        """Processes per node, resolved once from the machine: the spec's number, else one per GPU of the node's
        machine (``gpus``; 0: a CPU machine, one process), else None: only the node knows (a cluster whose machines
        the plan cannot see), and it starts one per GPU it has."""
        if isinstance(spec.procs_per_node, int):
            return spec.procs_per_node
        if gpus is None:
            return spec.gpus_per_node or None
        return gpus or 1

    def follow_logs(self, handle: JobHandle, follow: bool, read: Callable[[], Iterable[str]], poll: float,
                    rest: Callable[[], Iterable[str]] | None = None,
                    pause: Callable[[float], object] = time.sleep) -> Iterator[str]:
        """The log loop every provider shares: ``read()`` yields the lines written since its last call. Without
        ``follow``, one read. With it, read until the job has ended and a read after that found nothing more (a job
        that ends while its last lines are being written loses none), waiting ``poll`` seconds between reads that
        found nothing (``pause``: a wait that may end sooner, when the provider can tell the job changed). ``rest()``:
        what is left at the end (an unfinished last line)."""
        while True:
            ended = follow and self.describe(handle).state.terminal  # checked before the read that may be the last
            printed = False
            for line in read():
                printed = True
                yield line
            if not follow or (ended and not printed):
                if rest is not None:
                    yield from rest()
                return
            if not printed:
                pause(poll)

    @staticmethod
    def created_once(find: Callable[[], JobHandle | None], create: Callable[[], JobHandle],
                     lost: tuple[type[BaseException], ...] = ()) -> JobHandle:
        """Submit idempotently, as every provider does: the job this plan already created (a retried submit) if
        ``find`` sees one, else ``create``; when the reply to a create is lost (``lost``), the job may exist all the
        same, and it is this plan's if ``find`` sees it now. ``find`` refuses a job of the same name that is not
        this plan's (another bundle digest)."""
        found = find()
        if found is not None:
            return found
        try:
            return create()
        except lost:
            found = find()
            if found is None:
                raise
            return found

    # -- hooks -----------------------------------------------------------------------------------------
    def _check_capabilities(self, spec: JobSpec) -> None:
        needs = {Capability.SPOT: spec.spot, Capability.MULTI_NODE: spec.nodes > 1,
                 Capability.ACCELERATORS: bool(spec.accelerator)}
        missing = [feature.value for feature, wanted in needs.items() if wanted and feature not in self.capabilities]
        if missing:
            raise UserError(f"provider {self.name!r} does not support: {', '.join(missing)}",
                            remedy="remove those settings or choose another provider")

    def _capacity(self, spec: JobSpec) -> str:
        """How the job is billed: on_demand or spot (Vertex adds flex_start)."""
        return "spot" if spec.spot else "on_demand"

    def handle(self, job_id: str, scope: tuple[str, ...] = ()) -> JobHandle:
        """Hook: the handle of one of this provider's jobs. ``scope`` names where the job lives, in the order the
        declaration's ``handle_scope`` says (aws: the region; azure: subscription, resource group, workspace)."""
        if len(scope) != len(self.declaration.handle_scope):
            raise ValueError(f"a {self.name} handle names {self.declaration.handle_form()}, not scope {scope!r}")
        return JobHandle(self.name, job_id, scope)

    def _own(self, handle: JobHandle) -> JobHandle:
        if handle.provider != self.name:
            raise UserError(f"{handle} belongs to provider {handle.provider!r}, not {self.name!r}")
        if len(handle.scope) != len(self.declaration.handle_scope):
            raise HandleError(f"{handle} is not a {self.name} job handle: those are {self.declaration.handle_form()}",
                              remedy="copy the handle exactly as `cloudtrain submit` or `cloudtrain list` prints it")
        return handle

    def _translate(self, ctx: PlanContext) -> Translation:
        """Hook: the platform request for the job of ``ctx`` (cloudtrain.providers.translation): the planner resolved
        the context and builds the Plan from what this returns."""
        raise NotImplementedError

    def translates(self) -> bool:
        """Whether this provider translates (``_translate``); else it is an older plugin whose ``_plan`` composes
        the whole Plan itself."""
        return type(self)._translate is not Provider._translate

    def _plan(self, spec: JobSpec, package: Package) -> Planned:
        """The older hook (plugins written before ``_translate``): the whole Plan, composed by the provider."""
        raise NotImplementedError(f"{type(self).__name__} implements neither _translate nor _plan")

    @abstractmethod
    def _submit(self, plan: Planned) -> JobHandle: ...

    @abstractmethod
    def _describe(self, handle: JobHandle) -> JobStatus: ...

    @abstractmethod
    def _logs(self, handle: JobHandle, follow: bool) -> Iterator[str]: ...

    @abstractmethod
    def _cancel(self, handle: JobHandle) -> None: ...

    @abstractmethod
    def _list(self, limit: int) -> builtins.list[JobStatus]: ...

    def _resubmit(self, handle: JobHandle, new_name: str) -> JobHandle:
        raise NotImplementedError  # providers that declare Capability.RESUBMIT implement it

    def _preempt(self, handle: JobHandle) -> JobStatus:
        raise NotImplementedError  # providers that declare Capability.PREEMPT implement it
