"""The Python SDK: ``Job`` describes a job, ``Run`` is one submitted job on some provider.

    job = Job(script="train.py", source_dir=".", nodes=2, procs_per_node=2)
    print(job.plan("gcp").request)     # what would be sent, offline
    run = job.submit("local")
    for line in run.logs(follow=True): print(line)
    run.wait()
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobStatus
from cloudtrain.jobs.outputs import OutputFile
from cloudtrain.jobs.submitted import budget_note, chain_of, job_cost, logs, preempt, with_restart_point  # noqa: F401 - all still the SDK's to import
from cloudtrain.plan.model import Plan
from cloudtrain.plan.planner import plan_job  # the SDK's own: `from cloudtrain.sdk import plan_job`
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import Provider
from cloudtrain.show.reprs import RunStatus, job_html, job_text
from cloudtrain.spec.model import JobSpec, apply_overrides, load_spec, validate_spec


class Job:
    """A provider-agnostic job. Keyword arguments are the spec's fields (see ``cloudtrain schema``)."""

    def __init__(self, spec: JobSpec | None = None, **fields: Any) -> None:
        if spec is not None and fields:
            spec = validate_spec(apply_overrides(spec.model_dump(exclude_unset=True), fields))
        self.spec = spec if spec is not None else validate_spec(fields)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> Job:
        return cls(load_spec(path, overrides))

    def plan(self, provider: str = "local") -> Plan:
        return plan_job(self.spec, provider)

    def submit(self, provider: str = "local", take_over: bool = False, restore_from: int | None = None) -> Run:
        """Package, stage (with progress on a long upload) and start the job; returns at once (follow it with
        ``Run.logs(follow=True)``). ``take_over``: take the checkpoint URI over from the job of another lineage that
        holds it (``checkpoint.take_over``; without it such a submit is refused). ``restore_from``: resume from that
        checkpoint on purpose (`submit --restore-from N`: the newer ones are set aside in the store first)."""
        impl = get_provider(provider)
        spec = self.spec
        if take_over:
            spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"take_over": True})})
        plan = plan_job(spec, impl)
        with plan.package:
            if restore_from is not None:
                import sys

                from cloudtrain.contract import LINEAGE
                from cloudtrain.jobs.submitted import restore_from as choose

                choose(plan.spec.checkpoint.uri, restore_from, plan.nodes[0].env.get(LINEAGE) if plan.nodes else None,
                       log=lambda line: print(line, file=sys.stderr))
            handle = impl.submit(plan)
        return Run(handle, impl)

    def __repr__(self) -> str:
        s = self.spec
        return f"Job(name={s.name!r}, nodes={s.nodes}, procs_per_node={s.nproc_per_node}, strategy={s.strategy!r})"

    def __str__(self) -> str:
        return job_text(self.spec)

    def _repr_html_(self) -> str:
        return job_html(self.spec)


class Run:
    """One submitted job. ``Run.attach("local://...")`` reconnects to a job from another process."""

    def __init__(self, handle: JobHandle, provider: Provider | None = None) -> None:
        self.handle = handle
        self.provider = provider or get_provider(handle.provider)

    @classmethod
    def attach(cls, handle: str | JobHandle) -> Run:
        return cls(JobHandle.parse(handle) if isinstance(handle, str) else handle)

    def status(self) -> RunStatus:
        """The job's status (a ``JobStatus``); ``print()`` it for what `cloudtrain status HANDLE` prints: with the
        job's progress, goodput and, for a job recovery resubmitted, its lineage."""
        from cloudtrain.show.metrics import read_status

        return RunStatus.of(read_status(self.provider, self.handle), self.provider)

    def logs(self, follow: bool = False, merge: bool = False) -> Iterator[str]:
        """Each line prefixed with its node; node by node, or ``merge=True``: ordered by time (as `logs --merge`)."""
        return logs(self.provider, self.handle, follow=follow, merge=merge)

    def preempt(self) -> JobStatus:
        """Rehearse a spot interruption of this running job, as `cloudtrain preempt` does: every node gets SIGTERM,
        saves and stops; with restarts left (``max_restarts``) it restarts and resumes."""
        return preempt(self.provider, self.handle)

    def wait(self, timeout: float | None = None, poll: float = 1.0, recover: bool = False,
             max_restarts: int | None = None, progress: bool = True,
             max_recovery: float | None = None) -> JobStatus:
        """The final status. ``recover=True``: while the job ends preempted and restarts are left (the spec's
        ``max_restarts``, or ``max_restarts``), resubmit it; it resumes from its newest checkpoint. A job submitted
        with a fallback list (``provider=[...]``) whose capacity is gone moves to its next provider with its newest
        verified checkpoint, as `cloudtrain wait --recover` does. Status calls that fail in a way that passes are
        retried with backoff, and ``max_recovery`` seconds (default 24h) bound the time spent recovering. This Run
        then follows the newest submission. ``progress``: show the state and elapsed time while waiting."""
        from cloudtrain.progress import Progress

        started = time.monotonic()
        with Progress(f"waiting for {self.handle}", unit="s", enabled=progress, every=30) as bar:
            def waited(status: JobStatus) -> None:
                bar.label = f"{status.handle}: {status.state.value}, waited"
                bar.done = time.monotonic() - started
                bar.advance(0)

            if not recover:
                status = self.provider.wait(self.handle, timeout=timeout, poll=poll, on_poll=waited)
            else:
                from cloudtrain.jobs.fallback import move
                from cloudtrain.jobs.recovery import wait_with_recovery

                status = wait_with_recovery(self.provider, self.handle, max_restarts=max_restarts, timeout=timeout,
                                            poll=poll, max_recovery=max_recovery, mover=move)
                self.handle = status.handle
                if self.handle.provider != self.provider.name:  # moved along its fallback list
                    from cloudtrain.providers import get_provider

                    self.provider = get_provider(self.handle.provider)
            waited(status)
        return status

    def cancel(self) -> JobStatus:
        return self.provider.cancel(self.handle)

    def report(self, path: str | Path | None = None) -> Path:
        """Write the job's report, the one HTML page `cloudtrain report` writes (its timeline, progress, goodput and
        cost; it opens offline), to ``path`` as `cloudtrain report -o` does (default ``report-<job id>.html`` here; a
        folder: that name in it; a FIFO or a device written into, never replaced); returns where it is."""
        from cloudtrain.show.report import for_job, page
        from cloudtrain.show.report_target import write

        data = page(*for_job(self.provider, self.handle)).encode()
        target, _regular = write(data, None if path is None else str(path), self.handle.job_id)
        return target.resolve()

    def cost(self) -> dict[str, Any]:
        """What this job has cost so far at list prices, leg by leg, as `cloudtrain cost` shows it (with -o json)."""
        return job_cost(self.handle)

    def outputs(self, download: str | Path | None = None) -> list[OutputFile]:
        """The job's outputs (final model, node logs) at its output location; ``download``: copy them into that
        folder too (with progress) and return where each landed."""
        from cloudtrain.jobs.outputs import download as fetch
        from cloudtrain.jobs.outputs import list_outputs, output_uri

        uri = output_uri(self.provider, self.handle)
        return fetch(uri, Path(download)) if download is not None else list_outputs(uri)

    def __repr__(self) -> str:
        return f"Run({str(self.handle)!r})"

    def __str__(self) -> str:
        """The job's status as `cloudtrain status HANDLE` prints it (asks the provider)."""
        from cloudtrain.errors import CloudtrainError

        try:
            return str(self.status())
        except CloudtrainError as exc:
            return f"{self.handle} (status unavailable: {exc.message})"

    def _repr_html_(self) -> str:
        """The job's report, as `cloudtrain report` writes it: its timeline, progress, goodput and cost."""
        import html

        from cloudtrain.errors import CloudtrainError
        from cloudtrain.show.report import for_job, fragment  # only when a notebook shows it: the SDK imports light

        try:
            return fragment(*for_job(self.provider, self.handle))
        except CloudtrainError as exc:  # as print(run) does: the cell shows why, not a traceback
            return f"<div>{html.escape(f'{self.handle} (status unavailable: {exc.message})')}</div>"


def list_runs(provider: str = "local", limit: int = 50) -> list[JobStatus]:
    return get_provider(provider).list(limit)
