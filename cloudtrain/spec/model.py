"""The provider-agnostic job spec: one validated model for YAML files, CLI flags and Python objects.

Unknown keys are errors everywhere (``extra="forbid"``). Field names in YAML, in error messages and in
``cloudtrain schema`` are the same, so a message such as ``nodes: must be >= 1`` points at the line to edit.

``providers.<name>`` blocks are each provider's own options model, found through the registry and built only when a
spec names that provider or a plan is made for it, so a plan builds one provider's model and plain specs never read
the installed packages' entry points.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, create_model, field_validator, model_validator

from cloudtrain import contract, registry
from cloudtrain.errors import SpecError
from cloudtrain.spec.fields import (
    Duration,
    DurationOrOff,
    IntervalOrAuto,
    Model,
    Uri,
    Usd,
    one_token,
    parse_duration,
    path_problem,
)
from cloudtrain.spec.files import SPEC_FILENAME, project_options, read_spec_file
from cloudtrain.spec.messages import friendly_error, spec_error_from, unusable_text
from cloudtrain.storage.uris import SCHEMES as STORAGE_SCHEMES

__all__ = ["SPEC_FILENAME", "STORAGE_SCHEMES", "JobSpec", "apply_overrides", "check_local_paths", "friendly_error",
           "json_schema", "load_spec", "parse_duration", "project_options", "read_spec_file", "spec_error_from",
           "validate_spec"]

# Processes per node: the largest machines any of the platforms rents have 8-16 accelerators and under 200 vCPUs;
# more processes than that on one node only oversubscribe it (and 100,000 would fork-bomb a local run).
MAX_PROCS_PER_NODE = 256
MAX_IDLE = 30 * 60  # the hang watchdog is on unless a spec says max_idle: off (a hang ran to max_runtime unseen)
_Model = Model
_one_token = one_token


class NoOptions(Model):
    """A provider that declares no options: its block may only be empty."""


def options_model(provider: str) -> type[BaseModel]:
    """The model of ``providers.<provider>``: what the provider declares (``options`` in its registry entry)."""
    decl = registry.declaration(provider)
    return decl.load("options") if decl.options else NoOptions


class Providers(Model):
    """The spec's ``providers:`` block. It holds the options models of the providers a spec names (and of the one a
    plan is made for, `with_provider`), built when first needed: building every provider's model at import cost
    more than a local plan's own work. Any other registered provider reads as its defaults."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # type: ignore[misc]
        except AttributeError:
            if name.startswith("_") or not registry.exists(name):
                raise
            return options_model(name)()

    def held(self, name: str) -> Any:
        """``name``'s block when this model holds it (the spec names it, or a plan is made for it), else None:
        unlike attribute access, it builds no model for a provider that is not in play."""
        return getattr(self, name) if name in type(self).model_fields else None


@functools.cache
def _provider_options(names: tuple[str, ...]) -> type[BaseModel]:
    if not names:
        return Providers
    fields: dict[str, Any] = {}
    for name in names:
        model = options_model(name)
        fields[name] = (model, Field(default_factory=model))
    return create_model("ProviderOptions", __base__=Providers, **fields)


ProviderOptions = Providers
if TYPE_CHECKING:  # built from the registry at run time: to the type checker, any provider's block
    ProviderBlocks = Any
else:
    ProviderBlocks = ProviderOptions


class ImageSpec(_Model):
    """Container image: the provider's prebuilt PyTorch training image for a torch version, or a custom URI."""

    torch_version: str = Field("2.5", pattern=r"^\d+\.\d+(\.\d+)?$", description="e.g. '2.5'")
    python_version: str = Field("3.11", pattern=r"^3\.\d+$", description="e.g. '3.11'")
    uri: str | None = Field(None, description="A custom image URI; overrides the prebuilt image")

    _uri = field_validator("uri")(lambda value: _one_token(value))

    @field_validator("torch_version", "python_version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        if isinstance(value, float):  # YAML reads 2.10 as the number 2.1: refuse rather than guess
            raise ValueError(f"write the version as text in quotes, e.g. '{value}' (YAML reads 2.10 as 2.1)")
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class CheckpointSpec(_Model):
    uri: Uri | None = Field(None, description="Where checkpoints are kept; restored from on (re)start")
    dir: str | None = Field(
        None, description="The folder your script writes its checkpoints to, relative to its working folder (or "
                          "absolute): restored into before the script starts, under the names it wrote, and published "
                          "as it writes them, in any layout; default: a folder of the node's own, "
                          "$CLOUDTRAIN_CHECKPOINT_DIR")

    files: list[str] = Field(
        default_factory=list,
        description="The files every save writes, as globs in the checkpoint folder (checkpoint-*/optimizer.pt, "
                    "model.pt): each save is published the moment all are whole and newer than the last "
                    "checkpoint's; without them the set is learned from the saves, and the first save of a run waits "
                    "for the next to show it was whole")

    @field_validator("dir")
    @classmethod
    def _dir(cls, value: str | None) -> str | None:
        if value is not None:
            check_checkpoint_dir(value, {})
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: list[str]) -> list[str]:
        for glob in value:
            parts = glob.replace("\\", "/").split("/")
            if not glob.strip() or glob.startswith("/") or ".." in parts or "\n" in glob:
                raise ValueError(f"checkpoint.files: {glob!r} is not a glob inside the checkpoint folder; give paths "
                                 "relative to it, e.g. 'model.pt' or 'checkpoint-*/optimizer.pt'")
        return value
    interval: IntervalOrAuto | None = Field(
        None, description="Save at least this often (seconds or '10m'), or 'auto': the interval that keeps the most "
                          "training (Young/Daly, from the checkpoint cost and the interruptions of earlier runs)")
    keep: int = Field(contract.MIN_KEEP, ge=contract.MIN_KEEP, le=1000,
                      description=f"How many complete checkpoints to retain (>= {contract.MIN_KEEP})")
    take_over: bool = Field(
        False, description="Take the checkpoint URI over from the job of another lineage that holds it, even while "
                           "that job runs: it then writes no more checkpoints there (one live job writes to a URI; "
                           "its checkpoints stay where they are). For a job that is gone but whose lease has not "
                           "expired yet; set it for one submission, not in a spec you keep")


class PackageSpec(_Model):
    """What goes into the source bundle besides the .gitignore / .cloudtrainignore rules of source_dir."""

    exclude: list[str] = Field(default_factory=list, description="More gitignore-style patterns to leave out")
    allow_secrets: list[str] = Field(
        default_factory=list, description="Patterns of secret-looking files that may be packaged anyway")
    max_mb: int = Field(512, ge=1, description="Refuse a bundle whose source is larger than this")
    max_files: int = Field(50_000, ge=1, description="Refuse a bundle with more files than this")


_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
_ACCEL_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]*(:[1-9][0-9]*)?$"
_IDENT_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")  # fullmatch: '$' would let a trailing newline through
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


class JobSpec(_Model):
    """Everything cloudtrain needs to run one training job on any provider."""

    name: str | None = Field(
        None, pattern=_NAME_RE,
        description="Lowercase letters, digits and '-', at most 40 characters; default: the script name")
    provider: str | list[str] | None = Field(
        None, description="Where the job runs (default local); a list is a fallback order, e.g. [aws, gcp]: the next "
                          "is tried when one refuses for capacity or quota, or its capacity is gone")
    source_dir: str = Field(".", description="Folder packaged and shipped to every node (relative to the spec file)")
    script: str | None = Field(None, description="Training script, relative to source_dir")
    module: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*$", description="Or: a module run as 'python -m'")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script; ${CLOUDTRAIN_...} "
                            "node variables in them are replaced on each node "
                            "(e.g. --out_dir=${CLOUDTRAIN_CHECKPOINT_DIR})")
    resume_args: list[str] = Field(
        default_factory=list, description="Arguments added after args only when a checkpoint was restored, e.g. "
                                          "--init_from=resume")
    strategy: Literal["ddp", "fsdp"] = "ddp"
    nodes: int = Field(1, ge=1, le=512)
    procs_per_node: int | Literal["auto"] = Field(
        "auto", description="Processes per node; 'auto' = the accelerator count, or 1 without accelerators"
    )
    accelerator: str | None = Field(None, pattern=_ACCEL_RE, description="GPU model and count per node, e.g. 'A100:8'")
    image: ImageSpec = Field(default_factory=ImageSpec)
    env: dict[str, str] = Field(default_factory=dict)
    requirements: str | list[str] | None = Field(
        None, description="A requirements file in source_dir, or a list of pip requirement strings"
    )
    spot: bool = Field(False, description="Use spot/preemptible capacity")
    max_wait: Duration | None = Field(None, description="Spot only: total time to wait for capacity plus run")
    max_runtime: Duration = Field(24 * 3600, description="Stop the job after this long")
    max_idle: DurationOrOff = Field(
        MAX_IDLE, description="Hang watchdog: stop the job when its workers print nothing, write no checkpoint and "
                              "use no CPU for this long; 'off' turns it off")
    max_restarts: int = Field(0, ge=0, le=100, description="Resubmissions after preemption")
    max_cost: Usd | None = Field(
        None, description="Budget in USD at list prices across all restarts: the watcher (a foreground submit, wait "
                          "--recover) stops the job with a final checkpoint when the cost accrued reaches it")
    max_recovery: Duration | None = Field(
        None, description="The most time recovery may spend in all (waiting for a resubmitted or moved job to run "
                          "again, riding out a status-API outage) before it gives up and says so; default 24h")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    inputs: dict[str, Uri] = Field(default_factory=dict, description="Named input data URIs")
    output_uri: Uri | None = None
    require_process_group: bool = Field(
        False, description="Fail the job when a node's processes each trained alone (none took part in the job's "
                           "process group) instead of calling it a success; for CI")
    tags: dict[str, str] = Field(default_factory=dict)
    package: PackageSpec = Field(default_factory=PackageSpec)
    # SerializeAsAny: the block is a Providers subclass holding the providers in play, dumped with their fields
    providers: SerializeAsAny[ProviderBlocks] = Field(default_factory=ProviderOptions)

    @field_validator("providers", mode="before")
    @classmethod
    def _providers(cls, value: Any) -> Any:
        """A mapping is validated by a model of the providers it names (built on first use): no provider's
        options model is built until a spec names it. Errors keep their place (providers.aws.region)."""
        if isinstance(value, dict):
            return _provider_options(_providers_named({"providers": value})).model_validate(value)
        return value

    @field_validator("procs_per_node", mode="before")
    @classmethod
    def _procs_from_text(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        count = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,12}", value.strip()):
            count = int(value.strip())
        if count is None:
            raise ValueError("must be a whole number of processes or 'auto' (one per GPU, 1 without GPUs)")
        if not 1 <= count <= MAX_PROCS_PER_NODE:
            raise ValueError(f"must be between 1 and {MAX_PROCS_PER_NODE} (or 'auto'): more processes than the "
                             "largest machines have GPUs or cores only oversubscribe a node")
        return count

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _IDENT_RE.fullmatch(key):
                raise ValueError(f"input name {key!r} must start with a letter and use letters, digits and '_'")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_RE.fullmatch(key):
                raise ValueError(f"environment variable name {key!r} must match [A-Za-z_][A-Za-z0-9_]*")
        if (problem := path_problem(value.get(contract.OUTPUT_DIR) or "")) is not None:  # the folder a node uploads
            raise ValueError(f"{contract.OUTPUT_DIR} {problem}: name a folder a file system can hold")
        return value

    @field_validator("script", "requirements", "source_dir")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if bool(self.script) == bool(self.module):
            raise ValueError("give exactly one of 'script' (a file in source_dir) or 'module'")
        if self.max_wait is not None:
            if not self.spot:
                raise ValueError("max_wait applies to spot jobs only; set 'spot: true' or remove max_wait")
            if self.max_wait < self.max_runtime:
                raise ValueError(
                    f"max_wait ({self.max_wait}s) must be >= max_runtime ({self.max_runtime}s): it covers the run"
                )
        check_arg_variables(self)
        if self.checkpoint.dir is not None and self.env.get(contract.OUTPUT_DIR):
            check_checkpoint_dir(self.checkpoint.dir, self.env)
        if self.name is None:
            # Derive a valid name from the script or module; bypass assignment validation for this one field.
            object.__setattr__(self, "name", derive_name(self.script or self.module or "job"))
        return self

    # -- derived values -------------------------------------------------------------------------------
    @property
    def gpus_per_node(self) -> int:
        if not self.accelerator:
            return 0
        _, _, count = self.accelerator.partition(":")
        return int(count) if count else 1

    @property
    def accelerator_model(self) -> str | None:
        return self.accelerator.partition(":")[0].upper() if self.accelerator else None

    @property
    def nproc_per_node(self) -> int:
        """Resolved processes per node: explicit value, else one per GPU, else 1."""
        if isinstance(self.procs_per_node, int):
            return self.procs_per_node
        return self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


def check_arg_variables(spec: JobSpec) -> None:
    """Only cloudtrain's node variables (contract.ARG_VARIABLES, and an input's) may stand in args as ${NAME}."""
    known = {*contract.ARG_VARIABLES, *(f"{contract.INPUT_PREFIX}{name.upper()}" for name in spec.inputs)}
    for field, values in (("args", spec.args), ("resume_args", spec.resume_args)):
        for index, arg in enumerate(values):
            for escaped, name in re.findall(contract.ARG_VARIABLE, arg):
                if not escaped and name not in known:
                    raise ValueError(
                        f"{field}[{index}] names ${{{name}}}, which no node sets: the variables args may name are "
                        f"{', '.join(sorted(known))} (write $${{{name}}} for the text ${{{name}}} itself)")


def check_checkpoint_dir(value: str, env: dict[str, str]) -> None:
    """checkpoint.dir must be a folder of its own: not the source folder the bundle unpacks to, not above it, not
    the outputs folder (a platform uploads ./outputs itself), and relative paths stay inside the working folder."""
    text = value.strip()
    if not text:
        raise ValueError("must name a folder, e.g. checkpoints (relative to the script's working folder)")
    if problem := path_problem(text):
        raise ValueError(f"{problem}: name a folder a file system can hold, e.g. checkpoints")
    path = PurePosixPath(text)
    if path.is_absolute():
        parts = path.parts[1:]
        if not parts:
            raise ValueError("cannot be / : give a folder of its own, e.g. checkpoints")
    else:
        parts = tuple(p for p in path.parts if p != ".")
        if ".." in parts:
            raise ValueError(f"{value!r} leads out of the script's working folder (the source folder "
                             "on the node): give a folder inside it, e.g. checkpoints, or an absolute path")
        if not parts:
            raise ValueError("is the source folder itself, which the node unpacks anew at every start: "
                             "give your checkpoints a folder of their own inside it, e.g. checkpoints")
        if parts[0] == "outputs":
            raise ValueError("overlaps ./outputs, the job's output folder on platforms that upload it "
                             "(Azure ML): give checkpoints a folder of their own, e.g. checkpoints")
    output = env.get(contract.OUTPUT_DIR)
    if output and path.is_absolute():
        mine, theirs = PurePosixPath(text), PurePosixPath(output)
        if mine == theirs or theirs in mine.parents or mine in theirs.parents:
            raise ValueError(f"checkpoint.dir {value!r} overlaps env {contract.OUTPUT_DIR} {output!r}: give "
                             "checkpoints a folder of their own")


def derive_name(entry: str) -> str:
    stem = Path(entry).stem if entry.endswith(".py") else entry.rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return name or "job"


@functools.cache
def spec_model(names: tuple[str, ...] = ()) -> type[JobSpec]:
    """JobSpec whose ``providers`` block declares these providers' options: what `json_schema` describes (JobSpec
    itself validates any registered provider's block)."""
    if not names:
        return JobSpec
    options = _provider_options(names)
    return create_model("JobSpec", __base__=JobSpec, providers=(options, Field(default_factory=options)))


def _providers_named(raw: Any) -> tuple[str, ...]:
    """The registered providers a raw spec's ``providers:`` block names (unknown names stay out: the model refuses
    them, suggesting a registered name)."""
    block = raw.get("providers") if isinstance(raw, dict) else None
    names = [k for k in block if isinstance(k, str)] if isinstance(block, dict) else []
    return tuple(sorted(n for n in names if registry.exists(n)))


def options_of(spec: JobSpec, provider: str) -> Any:
    """``spec.providers.<provider>``, or that provider's defaults where the spec's model does not hold it."""
    found = getattr(spec.providers, provider, None)
    return found if found is not None else options_model(provider)()


def with_provider(spec: JobSpec, provider: str) -> JobSpec:
    """The spec under a model that holds ``provider``'s options (a plugin the spec did not name), unchanged
    otherwise: what plans for that provider need, so ``spec.providers.<provider>`` exists."""
    held = type(spec.providers).model_fields
    if provider in held:
        return spec
    model = _provider_options(tuple(sorted({*held, provider})))
    blocks = model(**{name: getattr(spec.providers, name) for name in spec.providers.model_fields_set})
    return spec.model_copy(update={"providers": blocks})


# -- loading, overriding, error translation ------------------------------------------------------------


def validate_spec(raw: dict[str, Any], source: str | None = None) -> JobSpec:
    bad = unusable_text(raw)
    if bad:
        where, what = bad
        raise SpecError(what, field=where, remedy=f"remove that character from {where} (in {source or 'the flags'})")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error_from(exc, source, spec_model(_providers_named(raw))) from None
    except RecursionError:
        raise SpecError("the spec nests values too deeply to check", remedy="a spec needs a few levels at most "
                        "(`cloudtrain schema` lists every field)") from None


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply dotted-key overrides (``checkpoint.uri``) from CLI flags; values that are None are skipped."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        target = merged
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = target.get(key)
            target[key] = child = dict(child) if isinstance(child, dict) else {}
            target = child
        target[leaf] = value
    return merged


def load_spec(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> JobSpec:
    raw = read_spec_file(path) if path is not None else {}
    return validate_spec(apply_overrides(raw, overrides or {}), source=str(path) if path else None)


def _inside(source: Path, relative: str, field: str, what: str) -> Path:
    """``source/relative``, refused when it leads outside ``source``: only source_dir is shipped to the nodes."""
    try:
        resolved = (source / relative).resolve()
    except (OSError, RuntimeError):  # a symbolic link loop, a name too long ...
        raise SpecError(f"{what} {relative!r} cannot be resolved (a symbolic link loop?)", field=field,
                        remedy=f"give the path of a file inside {source}") from None
    if Path(relative).is_absolute() or not resolved.is_relative_to(source):
        raise SpecError(f"{what} {relative!r} is outside source_dir {source}, and only source_dir is shipped to the "
                        "nodes", field=field, remedy=f"move it into {source} and give its path relative to source_dir, "
                                                     "or point source_dir at a folder that holds it")
    return resolved


def _not_a_file(path: Path) -> str:
    """Why ``path`` is no file to run: "not found", or what it is instead (a FIFO is never opened)."""
    from cloudtrain.regular_files import special

    kind = special(path) or ("a folder" if path.is_dir() else None)
    return f"is {kind}, not a regular file," if kind else "not found"


def check_local_paths(spec: JobSpec) -> Path:
    """Check that source_dir exists and that the script and requirements file are files inside it; return the
    resolved source dir."""
    try:
        source = Path(spec.source_dir).expanduser().resolve()
        found = source.is_dir()
    except (OSError, RuntimeError):
        found = False
    if not found:
        raise SpecError(f"folder {spec.source_dir!r} does not exist", field="source_dir",
                        remedy="point source_dir at the folder that holds your training code")
    if spec.script and not (script := _inside(source, spec.script, "script", "script")).is_file():
        raise SpecError(f"script {spec.script!r} {_not_a_file(script)} in {source}", field="script",
                        remedy="give the script's path relative to source_dir (or pass SCRIPT to `cloudtrain submit`)")
    if isinstance(spec.requirements, str) and \
            not (listed := _inside(source, spec.requirements, "requirements", "requirements file")).is_file():
        raise SpecError(f"requirements file {spec.requirements!r} {_not_a_file(listed)} in {source}",
                        field="requirements", remedy="give a path relative to source_dir, or a list of requirement "
                                                     "strings")
    return source


def json_schema() -> dict[str, Any]:
    """The spec's JSON Schema, every registered provider's options included (plugins too)."""
    schema = spec_model(tuple(registry.names())).model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "cloudtrain job spec"
    return schema
