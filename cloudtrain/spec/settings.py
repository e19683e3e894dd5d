"""User defaults per provider (region, role, bucket, workspace, project ...) in profiles, and where each setting of a
job comes from.

The file is YAML under the user's config dir (``$CLOUDTRAIN_CONFIG``, else ``$XDG_CONFIG_HOME/cloudtrain/config.yaml``,
else ``~/.config/cloudtrain/config.yaml``); its top-level keys are profile names, each holding provider blocks with
the same keys as ``providers.<name>`` in a job spec:

    default:
      aws: {region: us-east-1, role: "arn:aws:iam::123456789012:role/SageMakerExecution", bucket: my-bucket}
    research:
      gcp: {project: my-project, region: europe-west4, bucket: my-bucket}

Precedence, highest first: a flag (``--set``), the job spec, an environment variable, the profile (``--profile``,
``CLOUDTRAIN_PROFILE``, else ``default``), then what the platform's own tools are configured with (AWS profile,
gcloud, Azure ``config.json``) and cloudtrain's built-in default.

Which providers exist, their settings, the variables each setting is read from and how the platform's own tools are
read are each provider's to declare (cloudtrain.registry); this module only applies the precedence.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import contract, registry
from cloudtrain.errors import UserError

if TYPE_CHECKING:
    from cloudtrain.spec.model import JobSpec

CONFIG_ENV = contract.CONFIG
PROFILE_ENV = contract.PROFILE
DEFAULT_PROFILE = "default"


def env_names(provider: str, key: str) -> tuple[str, ...]:
    """The environment variables a provider reads ``key`` from, first set wins (its registry entry's ``env``).
    Providers resolve through `lookup`, so the declaration is the one place that says which variable means what."""
    return registry.declaration(provider).env.get(key, ())

_selected: str | None = None  # set by `--profile` / use_profile(); else $CLOUDTRAIN_PROFILE


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    if sys.platform == "win32" and env.get("APPDATA"):
        return Path(env["APPDATA"]) / "cloudtrain" / "config.yaml"
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "cloudtrain" / "config.yaml"


def use_profile(name: str | None) -> None:
    """Pick the profile for this process (the CLI's ``--profile``); None goes back to $CLOUDTRAIN_PROFILE/default."""
    global _selected
    _selected = name


def profile_name() -> str:
    return _selected or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE


def _options_model(provider: str) -> Any:
    from cloudtrain.spec.model import options_model

    return options_model(provider)


# the parsed and checked config file, keyed on what changes when it is rewritten (`_write` replaces the file, so its
# inode changes too): a plan asks for a dozen settings, and each read + check cost 12-73 ms
_CACHE: dict[Path, tuple[tuple[int, int, int, int], dict[str, dict[str, dict[str, Any]]]]] = {}


def read_config(path: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every profile in the file, each provider block checked against the spec's own option models (so a typo is
    an error naming the profile and key, not a silently ignored setting). A missing file is an empty config. Read
    once per version of the file; callers must not change what it returns."""
    path = path or config_path()
    try:
        st = path.stat()
    except OSError:
        stamp = None
    else:
        stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        cached = _CACHE.get(path)
        if cached and cached[0] == stamp:
            return cached[1]
    data = _read_config(path)
    if stamp is not None:
        _CACHE[path] = (stamp, data)
    return data


def _read_config(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    from cloudtrain.regular_files import read_text

    try:
        text = read_text(path)  # never a FIFO: opening one would wait for a writer
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}", field=CONFIG_ENV,
                        remedy="fix the file's permissions, or point CLOUDTRAIN_CONFIG elsewhere") from None
    import yaml  # only once there is a file to read: most runs have none
    from pydantic import ValidationError

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML{where}", remedy="fix its syntax, or remove the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must map profile names to provider settings",
                        remedy="start with `cloudtrain config set aws.region us-east-1`")
    for profile, blocks in data.items():
        if not isinstance(blocks, dict):
            raise UserError(f"{path}: profile {profile!r} must map providers to settings",
                            field=str(profile), remedy="write e.g. `default: {aws: {region: us-east-1}}`")
        for provider, options in blocks.items():
            if not isinstance(provider, str) or not registry.exists(provider):
                raise UserError(f"{path}: profile {profile!r} names unknown provider {provider!r}",
                                field=f"{profile}.{provider}", remedy=f"use one of {', '.join(registry.names())}")
            try:
                _options_model(provider).model_validate(options or {})
            except ValidationError as exc:
                err = exc.errors()[0]
                key = ".".join(str(p) for p in (profile, provider, *err["loc"]))
                raise UserError(f"{path}: {key}: {err['msg']}", field=key,
                                remedy="correct or remove it (`cloudtrain schema` lists each provider's keys)") \
                    from None
    return data


def profile_settings(provider: str, profile: str | None = None) -> dict[str, Any]:
    return dict(read_config().get(profile or profile_name(), {}).get(provider) or {})


def from_environment(provider: str, key: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the first variable set for this setting."""
    env = os.environ if env is None else env
    return next(((name, env[name]) for name in env_names(provider, key) if env.get(name)), None)


def lookup(provider: str, key: str, explicit: Any = None) -> Any:
    """A setting as providers resolve it (`resolve`): the spec's value (``explicit``), else the environment, the
    active profile, the platform's own tools; None when none sets it."""
    return resolve(provider, key, spec=explicit).value


# -- the one precedence: flag, spec, environment, profile, the platform's own tools, default ----------------------

_UNSET = object()


def _given(value: Any) -> bool:
    return value is not _UNSET and value is not None and not (isinstance(value, (str, list, dict)) and not value)


@dataclass(frozen=True)
class Found:
    """One setting's value and the place it came from."""

    value: Any
    source: str  # flag | spec | env NAME | profile NAME (path) | <the platform's tool, e.g. "aws profile (...)"> |
    #              default | unset
    kind: str  # flag | spec | env | profile | platform | default | unset
    shadowed: tuple[Found, ...] = ()  # lower places that set it too, each losing to this one

    @property
    def found(self) -> bool:
        return self.kind != "unset"


def resolve(provider: str, key: str, *, flag: Any = None, spec: Any = None, spec_source: str = "spec",
            env: Mapping[str, str] | None = None, profile: tuple[Mapping[str, Any], str] | None = None,
            platform: bool | tuple[Any, str] | None = True, default: Any = _UNSET, every: bool = False) -> Found:
    """``providers.<provider>.<key>`` from the first place that sets it: a flag, the spec, an environment variable
    (the provider's ``env``), the profile (default: the active one in the config file), the platform's own tools
    (True: the provider's ``settings`` hook; or a (value, where) found by the caller; None/False: not asked),
    the model's ``default``. With ``every``, the places below the winner are read too and listed in ``shadowed``
    (what `config` warns about). Plan, doctor and `config` all resolve through here."""

    def env_found() -> Found | None:
        hit = from_environment(provider, key, env)
        return Found(hit[1], f"env {hit[0]}", "env") if hit else None

    def profile_found() -> Found | None:
        block, where = profile if profile is not None else (
            profile_settings(provider), f"profile {profile_name()} ({config_path()})")
        value = block.get(key, _UNSET)
        return Found(value, where, "profile") if _given(value) else None

    def platform_found() -> Found | None:
        hit = _platform_setting(provider, key) if platform is True else platform or None
        return Found(hit[0], hit[1], "platform") if hit and _given(hit[0]) else None

    def default_found() -> Found | None:  # an empty list or mapping is no value: "unset"
        return None if default is _UNSET or default is None or default in ([], {}) else \
            Found(default, "default", "default")

    places: list[Callable[[], Found | None]] = [
        lambda: Found(flag, "flag", "flag") if _given(flag) else None,
        lambda: Found(spec, spec_source, "spec") if _given(spec) else None,
        env_found, profile_found, platform_found, default_found]
    winner: Found | None = None
    shadowed: list[Found] = []
    for place in places:
        if winner is not None and (not every or place is platform_found):  # asking the tools costs (botocore)
            continue
        hit = place()
        if hit is None:
            continue
        if winner is None:
            winner = hit
        elif hit.kind != "default":
            shadowed.append(hit)
    if winner is None:
        return Found(None, "unset", "unset")
    return replace(winner, shadowed=tuple(shadowed)) if shadowed else winner


def placeholder_note(provider: str, key: str) -> str:
    """The plan note for a setting found nowhere, naming every place it could come from."""
    places = [f"providers.{provider}.{key}", *env_names(provider, key), f"profile {profile_name()!r}"]
    return (f"{provider}: {key} is not set ({', '.join(places)}): the plan shows a placeholder, and submit refuses "
            f"until it is set (e.g. `cloudtrain config set {provider}.{key} ...`)")


def with_defaults(spec: JobSpec, provider: str) -> JobSpec:
    """The spec with every ``providers.<provider>`` setting it leaves unset filled from the environment or the
    profile, so the plan shows (and the platform receives) the values actually used."""
    from cloudtrain.spec.model import friendly_error, with_provider

    spec = with_provider(spec, provider)
    options = getattr(spec.providers, provider)
    # cloudtrain's own places only: a value the platform's tools hold stays theirs (the SDK reads it at submit)
    found = {key: resolve(provider, key, platform=False) for key in type(options).model_fields
             if key not in options.model_fields_set or getattr(options, key) is None}
    filled = {key: hit.value for key, hit in found.items() if hit.found}
    if not filled:
        return spec
    from pydantic import ValidationError

    try:
        merged = type(options).model_validate({**options.model_dump(exclude_unset=True), **filled})
    except ValidationError as exc:  # a bad value in the environment or the profile, not in the spec
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        hit = found.get(key)
        where = f"environment variable {hit.source.removeprefix('env ')}" if hit and hit.kind == "env" \
            else f"profile {profile_name()!r} ({config_path()})"
        raise UserError(f"from {where}: {friendly_error(err)}",
                        field=f"providers.{provider}.{key}",
                        remedy=f"correct it there, or set providers.{provider}.{key} in the spec") from None
    providers = spec.providers.model_copy(update={provider: merged})
    return spec.model_copy(update={"providers": providers})


# -- `cloudtrain config`: each setting and where it came from -----------------------------------------------


@dataclass(frozen=True)
class Setting:
    key: str  # providers.aws.region
    value: Any
    source: str  # flag | spec | env NAME | profile NAME (path) | <platform's own config> | default | unset
    overrides: tuple[Found, ...] = ()  # what else sets it, each losing to this value
    kind: str = ""  # the winner's place: flag | spec | env | profile | platform | default | unset

    def to_dict(self) -> dict[str, Any]:
        found = {"key": self.key, "value": self.value, "source": self.source}
        if self.overrides:
            found["overrides"] = [{"value": o.value, "source": o.source} for o in self.overrides]
        return found


def _platform_setting(provider: str, key: str) -> tuple[Any, str] | None:
    """What the platform's own tools are configured with, read offline (below cloudtrain's profile), or the
    provider's own default: its ``settings`` hook (registry)."""
    decl = registry.declaration(provider)
    if not decl.settings:
        return None
    hook = decl.load("settings")
    import inspect  # only here: a plan that reads no platform setting does not load it

    # a hook that reads one setting through another (kubernetes: the namespace of the context in use) takes the
    # resolver as its second argument, so no provider calls it itself
    wants = len(inspect.signature(hook).parameters) > 1
    found = hook(key, lambda other: lookup(provider, other)) if wants else hook(key)
    return (found[0], found[1]) if found else None


def explain(provider: str, spec_raw: Mapping[str, Any], flags: Mapping[str, Any]) -> list[Setting]:
    """Every ``providers.<provider>`` setting with its value, its source and what it overrides. ``spec_raw`` is the
    spec file as read, ``flags`` the dotted ``--set`` values."""
    providers = spec_raw.get("providers")
    block = providers.get(provider) if isinstance(providers, dict) else None
    in_spec = block if isinstance(block, dict) else {}
    settings = []
    for key, field in _options_model(provider).model_fields.items():
        dotted = f"providers.{provider}.{key}"
        default = field.get_default(call_default_factory=True)
        found = resolve(provider, key, flag=flags.get(dotted), spec=in_spec.get(key), default=default, every=True)
        settings.append(Setting(dotted, found.value, found.source, found.shadowed, found.kind))
    return settings


def profile_loses(setting: Setting, spec_file: str | None = None) -> str | None:
    """A note when the profile sets ``setting`` but a flag, the spec or an environment variable wins over it (a
    `config set` that would silently change nothing); None otherwise."""
    lost = next((f for f in setting.overrides if f.kind == "profile"), None)
    if lost is None or setting.kind not in ("flag", "spec", "env"):
        return None
    variable = setting.source.removeprefix("env ")
    winner, fix = {
        "flag": ("--set", "drop the flag"),
        "spec": (f"the spec {spec_file or ''}".rstrip(), f"remove it from {spec_file or 'the spec'}"),
        "env": (f"environment variable {variable}", f"unset {variable}"),
    }[setting.kind]
    return (f"{setting.key}: {winner} sets {setting.value!r}, which wins over {lost.value!r} from {lost.source}; "
            f"to use the profile's value, {fix}")


def after_set(key: str) -> str | None:
    """For `config set KEY`: the note saying that the project's spec here (./cloudtrain.yaml) or the environment
    overrides the profile's new value, if either does."""
    from cloudtrain.spec.files import project_spec, read_spec_file

    provider, name = _split_key(key)
    path = project_spec()
    providers = (read_spec_file(path) if path else {}).get("providers")
    block = providers.get(provider) if isinstance(providers, dict) else None
    found = resolve(provider, name, spec=block.get(name) if isinstance(block, dict) else None, platform=False,
                    every=True)
    return profile_loses(Setting(f"providers.{provider}.{name}", found.value, found.source, found.shadowed,
                                 found.kind), f"./{path}" if path else None)


def _split_key(key: str) -> tuple[str, str]:
    provider, _, name = key.removeprefix("providers.").partition(".")
    if not name or not registry.exists(provider):
        raise UserError(f"{key!r} is not PROVIDER.SETTING", field="KEY",
                        remedy="write e.g. aws.region, gcp.project or azure.workspace")
    if name not in _options_model(provider).model_fields:
        import difflib

        known = list(_options_model(provider).model_fields)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {provider}.{close[0]}?" if close else f" (known: {', '.join(known)})"
        raise UserError(f"{provider} has no setting {name!r}{hint}", field="KEY", remedy="use one of those keys")
    return provider, name


def is_set(key: str, profile: str | None = None) -> bool:
    """Whether the profile holds ``key`` (``aws.region``), so `config unset` can say what it did."""
    provider, name = _split_key(key)
    return name in profile_settings(provider, profile)


def _write(path: Path, data: dict[str, Any]) -> None:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)  # never a half-written config


def set_value(key: str, value: str | None, profile: str | None = None) -> Path:
    """Set (or with ``value=None`` remove) one setting in a profile; the value is read as YAML and checked against
    the spec's model before anything is written."""
    import yaml
    from pydantic import ValidationError

    from cloudtrain.spec.model import friendly_error

    provider, name = _split_key(key)
    profile = profile or profile_name()
    path = config_path()
    data = read_config(path)
    block = dict((data.get(profile) or {}).get(provider) or {})
    if value is None:
        if name not in block:
            return path  # nothing to remove: the file stays as it is (or absent)
        block.pop(name)
    else:
        try:
            parsed = yaml.safe_load(value) if value else value
        except yaml.YAMLError:
            parsed = value
        # text that YAML reads as a number or a boolean (a project number, a bucket named 2024) stays text where
        # only text is valid
        errors = []
        for candidate in [parsed] if isinstance(parsed, str) else [parsed, value]:
            try:
                _options_model(provider).model_validate({**block, name: candidate})
            except ValidationError as exc:
                errors.append(friendly_error(exc.errors()[0]))
                continue
            block[name] = candidate
            break
        else:
            raise UserError(f"{errors[0]} (got {parsed!r})", field=key,
                            remedy="give a valid value (`cloudtrain schema` describes it)")
    settings = {**(data.get(profile) or {}), provider: block}
    if not block:
        settings.pop(provider)
    profiles = {**data, profile: settings}
    if not settings:  # the last setting of a profile went: so does the profile
        profiles.pop(profile)
    _write(path, profiles)
    return path
