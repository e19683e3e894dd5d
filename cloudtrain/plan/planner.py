"""Planning a job: validate its paths, package its source, and ask the provider for the request it would send.
Nothing is staged or sent. The SDK (``Job.plan``), the CLI, ``plan --compare`` and fallback legs all plan here."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from cloudtrain.plan.assemble import assemble
from cloudtrain.plan.model import Plan
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import Provider
from cloudtrain.spec.model import JobSpec, check_local_paths

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package


def plan_job(spec: JobSpec, provider: str | Provider, progress: bool = True, spec_file: str | None = None,
             package: Package | None = None) -> Plan:
    """Validate paths, package the source and ask the provider for its request. Nothing is staged or sent.
    Provider settings the spec leaves unset come from the environment or the active profile (cloudtrain.spec.settings).
    ``spec_file``: the file the spec came from, shown in the plan. ``package``: one already built for this spec
    (`plan --compare` packages once for every provider); the caller closes it."""
    from cloudtrain.bundle.packaging import shown_path
    from cloudtrain.node.secret_values import split_args_note
    from cloudtrain.plan.cost import plan_budget, runtime_cap
    from cloudtrain.platforms.node_commands import checkpoint_notes, script_args
    from cloudtrain.spec.settings import with_defaults

    impl = get_provider(provider) if isinstance(provider, str) else provider
    spec = with_defaults(spec, impl.name)
    asked = spec
    spec, interval_note = _interval(asked, None)  # auto: the assumptions, until the plan names the machine
    contract = impl.contract(spec)  # a plugin's node contract travels in the bundle's lib/ (cloudtrain's is there)
    lib = {} if contract.node_module().startswith("cloudtrain.") else {contract.node_path(): contract.node_file()}
    shared = package is not None and not lib
    if not shared:
        package = _package(spec, check_local_paths(spec), progress, lib)
    assert package is not None
    try:
        plan = assemble(impl, spec, package)
        if interval_note:  # auto: what ended runs of this job on this provider, machine and nodes measured
            spec, interval_note = _interval(asked, plan)
            if spec.checkpoint.interval != plan.spec.checkpoint.interval:
                plan = assemble(impl, spec, package)
        plan.budget = budget = plan_budget(plan)  # max_cost: what it buys; refused below one hour of a list price
        # the platform holds the budget too, when nothing watches the job: its max_runtime, capped (the same
        # machines at the same rate: what the budget buys does not change)
        if budget and (cap := runtime_cap(plan)) is not None:
            plan = assemble(impl, spec.model_copy(update={"max_runtime": cap}), package)
            plan.budget = {**budget, "runtime_cap": cap}
        plan.notes += package.notes() + checkpoint_notes(plan.spec) + ([interval_note] if interval_note else [])
        if note := split_args_note(script_args(spec), spec.env):
            plan.notes.append(note)
    except BaseException:
        if not shared:
            package.close()
        raise
    plan.spec_file = shown_path(spec_file) if spec_file else None  # shown only: a name that is not UTF-8 as \xNN
    return plan


def _interval(spec: JobSpec, plan: Plan | None) -> tuple[JobSpec, str | None]:
    """``checkpoint.interval: auto`` made a number of seconds for this job (the nodes get seconds), and the plan's
    note saying what was chosen and why: from what ended runs of the job measured on the machines ``plan`` names
    (cloudtrain/home/measured.py), or assumed (no plan yet: the first assembly, which names the machine)."""
    from cloudtrain.plan.checkpoint_interval import AUTO, auto_interval, learned

    if spec.checkpoint.interval != AUTO:
        return spec, None
    chosen = learned(plan) if plan is not None else \
        auto_interval(spot=spec.spot, nodes=spec.nodes, max_runtime=spec.max_runtime)
    if spec.checkpoint.dir:  # the script's own stack saves when it decides (save_steps, every_n_train_steps ...)
        checkpoint = spec.checkpoint.model_copy(update={"interval": None})
        return spec.model_copy(update={"checkpoint": checkpoint}), chosen.stack_note()
    checkpoint = spec.checkpoint.model_copy(update={"interval": chosen.seconds})
    return spec.model_copy(update={"checkpoint": checkpoint}), chosen.note()


def _package(spec: JobSpec, source: Path, progress: bool, lib: dict[str, Path]) -> Package:
    """The source bundle; a file or folder the walk cannot read is a PackagingError naming it (nothing is left
    behind: the bundle's temp file goes with the error)."""
    from cloudtrain.bundle.checks import check_checkpoint_folder, check_entry_files
    from cloudtrain.bundle.packaging import PackageLimits, build_package
    from cloudtrain.errors import PackagingError

    rules = spec.package
    # checkpoint.dir is what the job writes, not source: a local run's checkpoints there would ship, and be "resumed"
    folder = checkpoint_folder(spec)
    written = ((folder, "checkpoint.dir: the job writes its checkpoints there, and each node starts with it "
                        "empty"),) if folder else ()
    limits = PackageLimits(max_bytes=rules.max_mb * 1024 * 1024, max_files=rules.max_files,
                           allow_secrets=tuple(rules.allow_secrets), exclude=tuple(rules.exclude),
                           own=_own_folders(spec, source), written=written)
    try:
        package = build_package(source, limits, progress=progress, lib=lib)
    except (OSError, RuntimeError) as exc:  # unreadable file or folder; a symbolic link loop (RuntimeError < 3.13)
        from cloudtrain.home.errors import is_write_error, os_problem
        from cloudtrain.home.paths import cloudtrain_home

        if isinstance(exc, OSError) and is_write_error(exc, cloudtrain_home()):  # the bundle's temp file, not source
            raise os_problem(exc, cloudtrain_home() / "tmp", "build the bundle") from None
        path = getattr(exc, "filename", None)
        reason = getattr(exc, "strerror", None) or str(exc)
        what = f"{path}: {reason}" if path else reason
        raise PackagingError(f"cannot package {source}: {what}", field="source_dir",
                             remedy="make it readable, remove the broken link, or leave it out of the package "
                                    "(.cloudtrainignore, or package.exclude in the spec)") from None
    try:
        check_checkpoint_folder(spec, source, folder, package)
        check_entry_files(spec, source, package, limits)
    except BaseException:
        package.close()
        raise
    return package


def checkpoint_folder(spec: JobSpec) -> str | None:
    """checkpoint.dir as a folder of the source (``a/b``), which the node unpacks to; None when it is absolute or
    unset (the spec refuses one that is the source itself or leads out of it)."""
    folder = spec.checkpoint.dir
    if not folder or PurePosixPath(folder.strip()).is_absolute():
        return None
    return "/".join(part for part in PurePosixPath(folder.strip()).parts if part != ".") or None


def _own_folders(spec: JobSpec, source: Path) -> tuple[tuple[str, str], ...]:
    """cloudtrain's own folders inside the source, which bundles leave out: its home (job records, logs, the local
    store) and the ``file://`` stores this job writes to (checkpoints, outputs)."""
    from cloudtrain import storage
    from cloudtrain.errors import UserError
    from cloudtrain.home.paths import cloudtrain_home

    places = [(str(cloudtrain_home()), "cloudtrain's home (CLOUDTRAIN_HOME: job records, logs, the local store)")]
    places += [(uri, what) for uri, what in (
        (spec.checkpoint.uri, "the job's checkpoint store (checkpoint.uri)"),
        (spec.output_uri, "the job's output store (output_uri)"),
        (getattr(spec.providers.held("local"), "store_uri", None),
         "the local provider's store (providers.local.store_uri)"))
        if uri and uri.startswith("file://")]
    own = []
    for place, what in places:
        try:
            rel = Path(storage.local_path(place)).expanduser().resolve().relative_to(source)
        except (OSError, RuntimeError, ValueError, UserError):  # elsewhere (the usual case), or not a local path
            continue
        if rel.parts:  # the source itself cannot be left out of its own package
            own.append((rel.as_posix(), what))
    return tuple(own)
