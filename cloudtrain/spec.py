"""The provider-agnostic job spec: one validated model for YAML files, CLI flags and Python objects.

Unknown keys are errors everywhere (``extra="forbid"``). Field names in YAML, in error messages and in
``cloudtrain schema`` are the same, so a message such as ``nodes: must be >= 1`` points at the line to edit.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cloudtrain.errors import SpecError

SPEC_FILENAME = "cloudtrain.yaml"
STORAGE_SCHEMES = ("file", "s3", "gs", "az", "abfs", "abfss")

_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: Any) -> Any:
    """Accept seconds (int) or strings such as ``90s``, ``30m``, ``2h``, ``1d12h``; return seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 3600, '30m' or '2h'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return int(text)
        match = _DURATION_RE.match(text)
        if text and match:
            days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
            return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    raise ValueError(f"{value!r} is not a duration; use seconds or a string such as '30m', '2h', '1d12h'")


Duration = Annotated[int, BeforeValidator(parse_duration, json_schema_input_type=int | str), Field(ge=1)]
Uri = Annotated[str, Field(min_length=1, description="Object storage URI: file://, s3://, gs://, az:// or abfs://")]


def check_storage_uri(value: str | None) -> str | None:
    if value is None:
        return None
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in STORAGE_SCHEMES:
        raise ValueError(
            f"{value!r} is not a storage URI; use one of "
            + ", ".join(f"{s}://" for s in STORAGE_SCHEMES)
            + " (for a local folder: file:///absolute/path)"
        )
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


class ImageSpec(_Model):
    """Container image: the provider's prebuilt PyTorch training image for a torch version, or a custom URI."""

    torch_version: str = Field("2.5", pattern=r"^\d+\.\d+(\.\d+)?$", description="e.g. '2.5'")
    python_version: str = Field("3.11", pattern=r"^3\.\d+$", description="e.g. '3.11'")
    uri: str | None = Field(None, description="A custom image URI; overrides the prebuilt image")

    @field_validator("torch_version", "python_version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        if isinstance(value, float):  # YAML reads 2.10 as the number 2.1: refuse rather than guess
            raise ValueError(f"write the version as text in quotes, e.g. '{value}' (YAML reads 2.10 as 2.1)")
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class CheckpointSpec(_Model):
    uri: Uri | None = Field(None, description="Where checkpoints are kept; restored from on (re)start")
    interval: Duration | None = Field(None, description="Save at least this often (seconds or '10m')")
    keep: int = Field(2, ge=2, description="How many complete checkpoints to retain (>= 2)")

    _check_uri = field_validator("uri")(check_storage_uri)


class PackageSpec(_Model):
    """What goes into the source bundle besides the .gitignore / .cloudtrainignore rules of source_dir."""

    exclude: list[str] = Field(default_factory=list, description="More gitignore-style patterns to leave out")
    allow_secrets: list[str] = Field(
        default_factory=list, description="Patterns of secret-looking files that may be packaged anyway")
    max_mb: int = Field(512, ge=1, description="Refuse a bundle whose source is larger than this")
    max_files: int = Field(50_000, ge=1, description="Refuse a bundle with more files than this")


class AwsOptions(_Model):
    region: str | None = None
    role: str | None = Field(None, description="IAM role ARN SageMaker assumes for the job")
    bucket: str | None = Field(None, description="S3 bucket for staging the source bundle")
    instance_type: str | None = Field(None, pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    volume_size_gb: int = Field(30, ge=1, le=16384)
    subnets: list[str] = Field(default_factory=list)
    security_group_ids: list[str] = Field(default_factory=list)


class AzureOptions(_Model):
    subscription_id: str | None = None
    resource_group: str | None = None
    workspace: str | None = None
    compute: str | None = Field(None, description="Compute cluster name; omit for serverless compute")
    instance_type: str | None = Field(None, description="VM size for serverless compute, e.g. Standard_NC24ads_A100_v4")
    experiment: str | None = None
    environment: str | None = Field(None, description="Azure ML environment (name@version) overriding the image")


class GcpOptions(_Model):
    project: str | None = None
    region: str | None = None
    bucket: str | None = Field(None, description="GCS bucket for staging the source bundle")
    machine_type: str | None = None
    accelerator_type: str | None = None
    service_account: str | None = None
    network: str | None = None
    capacity: Literal["spot", "flex_start"] | None = Field(
        None, description="Vertex scheduling strategy: 'spot' (as spot: true), or 'flex_start' (queued until the "
                          "whole capacity is free, for up to flex_start_max_wait)")
    flex_start_max_wait: Duration | None = Field(None, description="With capacity: flex_start; default: no limit")


class LocalOptions(_Model):
    store_uri: Uri | None = Field(
        None, description="Object store for staged bundles (default: file:// under the cloudtrain home)")
    grace_period: Duration = Field(30, description="Seconds between SIGTERM and SIGKILL on cancel")
    emulate: Literal["sagemaker", "azureml", "vertex"] | None = Field(
        None, description="Run each node under that platform's environment contract (files and variables)")

    _check_uri = field_validator("store_uri")(check_storage_uri)


class ProviderOptions(_Model):
    aws: AwsOptions = Field(default_factory=AwsOptions)
    azure: AzureOptions = Field(default_factory=AzureOptions)
    gcp: GcpOptions = Field(default_factory=GcpOptions)
    local: LocalOptions = Field(default_factory=LocalOptions)


_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
_ACCEL_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]*(:[1-9][0-9]*)?$"
_IDENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JobSpec(_Model):
    """Everything cloudtrain needs to run one training job on any provider."""

    name: str | None = Field(
        None, pattern=_NAME_RE,
        description="Lowercase letters, digits and '-', at most 40 characters; default: the script name")
    source_dir: str = Field(".", description="Folder packaged and shipped to every node (relative to the spec file)")
    script: str | None = Field(None, description="Training script, relative to source_dir")
    module: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*$", description="Or: a module run as 'python -m'")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script")
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
    max_idle: Duration | None = Field(
        None, description="Watchdog: stop the job when its workers print nothing and write no checkpoint for this "
                          "long (a hang); off unless set")
    max_restarts: int = Field(0, ge=0, le=100, description="Resubmissions after preemption")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    inputs: dict[str, Uri] = Field(default_factory=dict, description="Named input data URIs")
    output_uri: Uri | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    package: PackageSpec = Field(default_factory=PackageSpec)
    providers: ProviderOptions = Field(default_factory=ProviderOptions)

    @field_validator("procs_per_node", mode="before")
    @classmethod
    def _procs_from_text(cls, value: Any) -> Any:
        if isinstance(value, str) and value.isdigit():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError("must be >= 1 (or 'auto')")
        return value

    @field_validator("output_uri")
    @classmethod
    def _output_uri(cls, value: str | None) -> str | None:
        return check_storage_uri(value)

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: dict[str, str]) -> dict[str, str]:
        for key, uri in value.items():
            if not _IDENT_RE.match(key):
                raise ValueError(f"input name {key!r} must start with a letter and use letters, digits and '_'")
            check_storage_uri(uri)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_RE.match(key):
                raise ValueError(f"environment variable name {key!r} must match [A-Za-z_][A-Za-z0-9_]*")
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


def derive_name(entry: str) -> str:
    stem = Path(entry).stem if entry.endswith(".py") else entry.rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return name or "job"


# -- loading, overriding, error translation ------------------------------------------------------------


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1] if parts else ''}[{item}]"]
        elif item in {"function-before[parse_duration(), int]", "constrained-int", "literal['auto']", "int", "str"}:
            continue  # pydantic's union/validator branch names mean nothing to a user
        else:
            parts.append(str(item))
    return ".".join(parts) or "spec"


def _known_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at the parent of ``loc`` (for 'did you mean' hints)."""
    current: Any = model
    for item in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(item)
        if field is None:
            return []
        current = field.annotation
    return list(getattr(current, "model_fields", {}))


def _friendly(err: Any) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx['pattern']}"
    return str(err["msg"]).removeprefix("Value error, ")


def spec_error_from(exc: ValidationError, source: str | None = None) -> SpecError:
    """Turn pydantic's errors into one message that names each field and its fix."""
    lines: list[str] = []
    remedies: list[str] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _location(loc)
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            close = difflib.get_close_matches(key, _known_fields(JobSpec, loc), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            lines.append(f"{where}: unknown key{hint}")
            remedies.append(f"remove or rename '{key}'")
        else:
            msg = _friendly(err)
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
            lines.append(f"{where}: {msg}{shown}" if where != "spec" else f"{msg}")
            if where != "spec":
                remedies.append(f"set {where} to a valid value")
    prefix = f"invalid job spec in {source}:\n  " if source else "invalid job spec:\n  "
    remedy = "; ".join(dict.fromkeys(remedies)) or "correct the spec as described above"
    remedy += " (`cloudtrain schema` lists every field)"
    return SpecError(prefix + "\n  ".join(lines), remedy=remedy)


def validate_spec(raw: dict[str, Any], source: str | None = None) -> JobSpec:
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error_from(exc, source) from None


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML spec into a plain dict, resolving source_dir relative to the file."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"spec file {str(file)!r} does not exist", field="-f/--file",
                        remedy="pass an existing file, or run `cloudtrain init` to write one")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{file} is not valid YAML{where}: {problem}",
                        remedy="fix the YAML syntax (indentation, quotes, ':' after each key)") from None
    except UnicodeDecodeError:
        raise SpecError(f"{file} is not UTF-8 text", remedy="save the spec as UTF-8 YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{file} must hold a mapping of keys (name:, script:, nodes: ...), not a {type(data).__name__}",
                        remedy="start from `cloudtrain init`")
    base = file.resolve().parent
    source_dir = data.get("source_dir", ".")
    if isinstance(source_dir, str):
        data["source_dir"] = str((base / source_dir).resolve())
    return data


def project_options(provider: str) -> dict[str, Any]:
    """The ``providers.<provider>`` block of the project here (./cloudtrain.yaml), or {}: where commands that take
    no spec (``list``) look for a region, project or workspace before the profile and the platform's tools."""
    raw = read_spec_file(SPEC_FILENAME) if Path(SPEC_FILENAME).is_file() else {}
    providers = raw.get("providers")
    block = providers.get(provider) if isinstance(providers, dict) else None
    return dict(block) if isinstance(block, dict) else {}


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


def check_local_paths(spec: JobSpec) -> Path:
    """Check that source_dir and the script exist; return the resolved source dir."""
    source = Path(spec.source_dir).expanduser()
    if not source.is_dir():
        raise SpecError(f"folder {spec.source_dir!r} does not exist", field="source_dir",
                        remedy="point source_dir at the folder that holds your training code")
    if spec.script:
        script = source / spec.script
        if not script.is_file():
            raise SpecError(f"script {spec.script!r} not found in {source}", field="script",
                            remedy="give the script's path relative to source_dir "
                            "(or pass SCRIPT to `cloudtrain submit`)")
    if isinstance(spec.requirements, str) and not (source / spec.requirements).is_file():
        raise SpecError(f"requirements file {spec.requirements!r} not found in {source}", field="requirements",
                        remedy="give a path relative to source_dir, or a list of requirement strings")
    return source.resolve()


def json_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "cloudtrain job spec"
    return schema
