"""`cloudtrain doctor`: which extras are installed and which credentials and settings each provider would find, with
the fix for each missing piece.

Fast and offline on purpose (it is run when something is already wrong, maybe without a network): no provider SDK,
no torch, no pydantic and no metadata-server call. Versions come from installed distribution metadata; credentials
are looked up where each SDK's default chain looks, in environment variables and files only. A credential is named by
the variable or file it was found in; its value is never put into a check.

Statuses:

- ``ok``: found.
- ``missing``: the provider cannot work as things stand: the extra is not installed, the SDK would find no
  credentials or broken ones (a profile named but not defined, a key file named but absent, half a key pair), or
  cloudtrain's own config file cannot be read.
- ``warn``: it may still work, or needs attention: a distribution older than cloudtrain asks for, an SSO login that
  is absent or expired, a setting the job spec may still supply (region, role, bucket, workspace, project).

No credentials at all is ``missing``, except on a VM of that same cloud, where it is ``warn``: there the instance's
own identity (EC2 instance role, Azure managed identity, GCE service account) comes from the metadata server, which
an offline check cannot ask. Whether this is such a VM is read from the firmware's vendor strings (DMI files).

Settings (region, role, bucket, project, workspace) resolve as the providers resolve them: the project's job spec
(``./cloudtrain.yaml``, its ``providers:`` block, as every other command reads it), the environment, then
cloudtrain's profile (``cloudtrain.config``), then the platform's own tools (AWS profile, gcloud config, the
workspace's config.json). A spec that cannot be read is reported as a check of its own.
"""

from __future__ import annotations

import configparser
import functools
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from cloudtrain import config
from cloudtrain.errors import ProviderNotFound
from cloudtrain.providers import BUILTIN

PACKAGE = "cloudtrain"
AREAS = ("local", "aws", "azure", "gcp")
_COLORS = {"ok": "\033[32m", "warn": "\033[33m", "missing": "\033[31m"}
_RESET = "\033[0m"


@dataclass(frozen=True)
class Check:
    area: str  # "cloudtrain", "local", "aws", "azure" or "gcp"
    name: str  # "extra", "credentials", "region", "torch" ...
    status: str  # "ok", "warn" or "missing"
    detail: str  # what was found (versions, names of variables and files; never a secret value)
    fix: str = ""  # the command or step that fixes it; "" when ok

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def diagnose(providers: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
             home: Path | None = None) -> list[Check]:
    """Checks for ``providers`` (default: all four), reading ``env`` (default: os.environ) and the files under
    ``home`` (default: the user's home) in place of the real ones where given. Python and cloudtrain's own config
    file are always checked. Workspace config.json files are looked for from the current directory up."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    wanted = list(AREAS) if providers is None else list(providers)
    unknown = [p for p in wanted if p not in AREAS]
    if unknown:
        raise ProviderNotFound(f"doctor knows no provider {unknown[0]!r}", remedy="choose from " + ", ".join(AREAS))
    spec, spec_check = _project_spec()
    ctx = _Context(env, home, _cloud_vm(), _user_config(env, home), spec)
    checks = [_python_check(), _config_check(ctx), *([spec_check] if spec_check else [])]
    for area in AREAS:
        if area in wanted:
            checks += _AREA_CHECKS[area](ctx)
    return checks


def render(checks: list[Check], color: bool = False) -> str:
    """One aligned line per check (status, area, name, detail); a check's fix on an indented line below it."""
    if not checks:
        return ""
    width = [max(len(getattr(c, f)) for c in checks) for f in ("status", "area", "name")]
    indent = " " * (sum(width) + 6)  # under the detail column
    lines = []
    for c in checks:
        status = c.status.ljust(width[0])  # padded before colouring, so the escape codes do not skew the columns
        if color and c.status in _COLORS:
            status = f"{_COLORS[c.status]}{status}{_RESET}"
        lines.append(f"{status}  {c.area.ljust(width[1])}  {c.name.ljust(width[2])}  {c.detail}".rstrip())
        if c.fix:
            lines.append(f"{indent}fix: {c.fix}")
    return "\n".join(lines)


# -- what cloudtrain requires ------------------------------------------------------------------------------------

_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_MINIMUM = re.compile(r">=\s*([0-9][^,;\s]*)")


@functools.lru_cache(maxsize=1)
def _requirements() -> tuple[dict[str, list[tuple[str, str]]], str]:
    """({extra: [(distribution, minimum version or "")]}, Requires-Python).

    From pyproject.toml when cloudtrain runs from a source checkout (an editable install's metadata is a snapshot
    taken at install time and goes stale when pyproject changes), else from the installed package's metadata."""
    raw: list[tuple[str, str]] = []  # (requirement, extra)
    python = ""
    project = _source_project(Path(__file__).resolve().parent.parent / "pyproject.toml")
    if project is not None:
        for extra, requirements in (project.get("optional-dependencies") or {}).items():
            raw += [(str(r), str(extra)) for r in requirements]
        python = str(project.get("requires-python") or "")
    else:
        try:
            for requirement in metadata.requires(PACKAGE) or []:
                marker = _EXTRA_MARKER.search(requirement.partition(";")[2])
                if marker:
                    raw.append((requirement.partition(";")[0], marker.group(1)))
            python = metadata.metadata(PACKAGE)["Requires-Python"] or ""
        except (metadata.PackageNotFoundError, KeyError):  # neither installed nor a checkout: nothing to go on
            pass
    extras: dict[str, list[tuple[str, str]]] = {}
    for requirement, extra in raw:
        match = _REQUIREMENT.match(requirement)
        if match and match.group(1).lower() != PACKAGE:  # "all" = "cloudtrain[local,...]" names no distribution
            minimum = _MINIMUM.search(match.group(2))
            extras.setdefault(extra, []).append((match.group(1), minimum.group(1) if minimum else ""))
    return extras, python


def _source_project(pyproject: Path) -> dict[str, Any] | None:
    try:
        import tomllib
    except ImportError:  # Python 3.10: use the installed metadata instead
        return None
    try:
        project = tomllib.loads(pyproject.read_text()).get("project")
    except (OSError, ValueError):
        return None
    return project if isinstance(project, dict) and project.get("name") == PACKAGE else None


def _installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, from its metadata alone (nothing is imported). Tests replace it."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def _at_least(version: str, minimum: str) -> bool:
    """Release numbers only ("2.4.0+cu121" >= "2.4"): enough for the >= bounds cloudtrain's extras use."""
    have, need = _release(version), _release(minimum)
    size = max(len(have), len(need))
    return have + (0,) * (size - len(have)) >= need + (0,) * (size - len(need))


def _python_check() -> Check:
    required = _requirements()[1]
    here = ".".join(str(n) for n in sys.version_info[:3])
    minimum = _MINIMUM.search(required)
    if minimum and not _at_least(here, minimum.group(1)):
        return Check(PACKAGE, "python", "missing", f"Python {here}; cloudtrain needs {required}",
                     f"use Python {minimum.group(1)} or newer")
    return Check(PACKAGE, "python", "ok", f"Python {here}" + (f" (cloudtrain needs {required})" if required else ""))


def _extra_check(area: str, name: str, more_fix: str = "") -> Check:
    """The provider's pip extra (its name from the provider registry, its distributions from cloudtrain's own
    requirements): each distribution installed, at its minimum version or newer."""
    extra = BUILTIN[area].extra
    fix = f"pip install '{PACKAGE}[{extra}]'{more_fix}"
    wanted = _requirements()[0].get(extra)
    if wanted is None:
        return Check(area, name, "warn", f"cannot tell what {PACKAGE}[{extra}] needs (no package metadata)",
                     "reinstall cloudtrain: " + fix)
    found, missing, old = [], [], []
    for distribution, minimum in wanted:
        version = _installed_version(distribution)
        if version is None:
            missing.append(distribution)
        elif minimum and not _at_least(version, minimum):
            old.append(f"{distribution} {version} (needs >={minimum})")
        else:
            found.append(f"{distribution} {version}")
    if missing:
        have = "; installed: " + ", ".join(found + old) if found or old else ""
        return Check(area, name, "missing", "not installed: " + ", ".join(missing) + have, fix)
    if old:
        return Check(area, name, "warn", "too old: " + ", ".join(old), fix.replace("pip install", "pip install -U", 1))
    return Check(area, name, "ok", ", ".join(found))


# -- shared helpers ----------------------------------------------------------------------------------------------

_DMI = Path("/sys/class/dmi/id")
_XEN_UUID = Path("/sys/hypervisor/uuid")  # older (Xen) EC2 instances: starts with "ec2"
_AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"  # the chassis asset tag every Azure VM reports


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return ""


def _cloud_vm() -> str | None:
    """The cloud ("aws", "azure", "gcp") whose VM this machine is, from the firmware's vendor strings: a file read,
    unlike asking the metadata server. Tests replace it."""
    vendor, product = _read(_DMI / "sys_vendor"), _read(_DMI / "product_name")
    if vendor == "Amazon EC2" or _read(_XEN_UUID).lower().startswith("ec2"):
        return "aws"
    if vendor == "Google" or product == "Google Compute Engine":
        return "gcp"
    if _read(_DMI / "chassis_asset_tag") == _AZURE_ASSET_TAG:
        return "azure"
    return None


def _env_path(value: str | None, default: Path, home: Path) -> Path:
    """A path named by an environment variable ("~" meaning ``home``), else the default."""
    if not value:
        return default
    if value == "~" or value.startswith("~/"):
        return home / value[2:]
    return Path(value)


def _shown(path: Path, home: Path) -> str:
    try:
        return "~/" + path.relative_to(home).as_posix()
    except ValueError:
        return str(path)


def _json_file(path: Path, encoding: str = "utf-8") -> dict[str, Any] | None:
    """A JSON object from a file; None when absent or unreadable (the error is never shown: it may quote a secret)."""
    try:
        data = json.loads(path.read_text(encoding=encoding))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class _Unparsable(Exception):
    def __init__(self, path: Path) -> None:
        self.path = path


def _ini(path: Path) -> dict[str, dict[str, str]]:
    """The sections of an INI file ({} when absent). Raises _Unparsable without the parser's message, which quotes
    the offending line: in a credentials file that may be a secret."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raise _Unparsable(path) from None
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\0none")
    try:
        parser.read_string(text)
    except configparser.Error:
        raise _Unparsable(path) from None
    return {section: dict(parser[section]) for section in parser.sections()}


_VM_IDENTITY = {"aws": "an EC2 instance, whose instance role", "azure": "an Azure VM, whose managed identity",
                "gcp": "a Compute Engine VM, whose service account"}


def _no_credentials(area: str, vm: str | None, detail: str, fix: str) -> Check:
    """No credentials to be seen: "missing", or "warn" on the same cloud's VM (see the module's docstring)."""
    if vm == area:
        return Check(area, "credentials", "warn", f"{detail}; this machine is {_VM_IDENTITY[area]} may supply "
                                                  "credentials (not checked: that needs the metadata server)", fix)
    return Check(area, "credentials", "missing", detail, fix)


# -- settings: the environment, cloudtrain's profile, the platform's tools --------------------------------------

@dataclass(frozen=True)
class _UserConfig:
    """cloudtrain's profile file, read with yaml alone: `cloudtrain config` validates its keys against the spec's
    models, which needs pydantic and costs more than all of doctor; doctor checks its syntax and shape."""
    path: Path
    profile: str  # the selected profile
    data: dict[str, Any]  # {} when absent or broken
    problem: str  # why it cannot be used; "" when fine

    def settings(self, provider: str) -> dict[str, Any]:
        block = (self.data.get(self.profile) or {}).get(provider)
        return block if isinstance(block, dict) else {}


@dataclass(frozen=True)
class _Context:
    env: Mapping[str, str]
    home: Path
    vm: str | None  # the cloud whose VM this is
    user: _UserConfig
    spec: dict[str, dict[str, Any]]  # the providers: block of ./cloudtrain.yaml, by provider


def _project_spec() -> tuple[dict[str, dict[str, Any]], Check | None]:
    """The project's spec here, as plan and submit read it: its provider settings, and a check saying which file
    (or why it cannot be used). No spec file: ({}, None)."""
    from cloudtrain.errors import SpecError
    from cloudtrain.specfile import project_options, project_spec

    path = project_spec()
    if path is None:
        return {}, None
    try:
        found = {area: project_options(area) for area in AREAS}
    except SpecError as exc:
        return {}, Check(PACKAGE, "spec", "missing", f"./{path} cannot be read: {exc.message}",
                         exc.remedy or "fix it (`cloudtrain plan` shows the same error)")
    return found, Check(PACKAGE, "spec", "ok", f"./{path}: plan and submit use it; settings below include its "
                                               "providers: block")


def _user_config(env: Mapping[str, str], home: Path) -> _UserConfig:
    # config_path's own rules (CLOUDTRAIN_CONFIG, XDG_CONFIG_HOME ...), with ``home`` standing for the user's home
    path = config.config_path({**env, "XDG_CONFIG_HOME": env.get("XDG_CONFIG_HOME") or str(home / ".config")})
    # profile_name() also knows the CLI's --profile, but reads os.environ: used only when that is the env in use
    profile = config.profile_name() if env is os.environ else env.get(config.PROFILE_ENV) or config.DEFAULT_PROFILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _UserConfig(path, profile, {}, "")
    except (OSError, ValueError):
        return _UserConfig(path, profile, {}, "cannot be read")
    import yaml  # only when the file exists

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return _UserConfig(path, profile, {}, "is not valid YAML")
    if not isinstance(data, dict):
        return _UserConfig(path, profile, {}, "must map profile names to provider settings")
    for name, blocks in data.items():
        if not isinstance(blocks, dict) or not all(p in config.PROVIDERS and isinstance(b, (dict, type(None)))
                                                   for p, b in blocks.items()):
            return _UserConfig(path, profile, {}, f"profile {name!r} must map providers "
                                                  f"({', '.join(config.PROVIDERS)}) to settings")
    return _UserConfig(path, profile, data, "")


def _config_check(ctx: _Context) -> Check:
    user, shown = ctx.user, _shown(ctx.user.path, ctx.home)
    if user.problem:
        return Check(PACKAGE, "config", "missing", f"{shown} {user.problem}: cloudtrain stops on it when it looks up "
                                                   "a setting there",
                     f"fix {shown} (`cloudtrain config set` writes valid entries), or remove it")
    if not user.path.exists():
        return Check(PACKAGE, "config", "ok", f"no {shown} (optional: `cloudtrain config set aws.region us-east-1` "
                                              "writes one)")
    if user.profile in user.data:
        return Check(PACKAGE, "config", "ok", f"profile {user.profile} in {shown}")
    others = ", ".join(map(str, user.data)) or "none"
    if user.profile == config.DEFAULT_PROFILE:
        return Check(PACKAGE, "config", "ok", f"{shown}: no profile {user.profile!r} (profiles: {others})")
    return Check(PACKAGE, "config", "warn", f"profile {user.profile!r} is selected, but {shown} has none of that name "
                                            f"(profiles: {others})",
                 f"choose an existing profile, or add settings to {user.profile!r} with `cloudtrain config set`")


def _setting(ctx: _Context, provider: str, key: str) -> tuple[str, str] | None:
    """(value, where) as a plan resolves a setting: the project's spec, then (config.lookup) the environment, then the
    profile."""
    value = ctx.spec.get(provider, {}).get(key)
    if value not in (None, ""):
        return str(value), f"./cloudtrain.yaml providers.{provider}.{key}"
    found = config.from_environment(provider, key, ctx.env)
    if found:
        return found[1], found[0]
    value = ctx.user.settings(provider).get(key)
    if value not in (None, ""):
        return str(value), f"cloudtrain profile {ctx.user.profile}"
    return None


def _setting_check(ctx: _Context, provider: str, key: str, what: str, unset: str, example: str,
                   platform: tuple[str, str] | None = None, platform_place: str = "", platform_fix: str = "") -> Check:
    """A provider setting: found (value and where), else a warning naming every place looked in and every way to set
    it. A warning, not "missing": a spec given with -f may still set it."""
    found = _setting(ctx, provider, key) or platform
    if found:
        return Check(provider, key, "ok", f"{found[0]} ({found[1]})")
    variables = config.ENV.get(provider, {}).get(key, ())
    places = ["./cloudtrain.yaml", *variables, f"cloudtrain profile {ctx.user.profile}",
              *([platform_place] if platform_place else [])]
    looked = ", ".join(places[:-1]) + " or " + places[-1] if len(places) > 1 else places[0]
    fixes = [f"set providers.{provider}.{key} in cloudtrain.yaml", f"`cloudtrain config set {provider}.{key} "
                                                                    f"{example}`"]
    fixes += [f"export {variables[0]}={example}"] if variables else []
    fixes += [platform_fix] if platform_fix else []
    return Check(provider, key, "warn", f"no {what} in {looked}: fine if the job spec you submit sets "
                                        f"providers.{provider}.{key}; otherwise {unset}", ", or ".join(fixes))


# -- local -------------------------------------------------------------------------------------------------------

def _local_checks(ctx: _Context) -> list[Check]:
    return [_extra_check("local", "torch", " (or the torch build for your CUDA version: https://pytorch.org)")]


# -- aws ---------------------------------------------------------------------------------------------------------

_AWS_LOGIN = "run `aws configure` or `aws sso login`, or export AWS_PROFILE"
_PLACEHOLDER = "plans show a placeholder and submit refuses"


@dataclass
class _AwsFiles:
    credentials: Path
    config: Path
    profiles: dict[str, dict[str, str]]  # credentials-file values over config-file ones, as botocore merges them
    origin: dict[tuple[str, str], Path]  # (profile, key) -> the file it came from
    sso_sessions: dict[str, dict[str, str]]


def _aws_files(env: Mapping[str, str], home: Path) -> _AwsFiles:
    files = _AwsFiles(_env_path(env.get("AWS_SHARED_CREDENTIALS_FILE"), home / ".aws" / "credentials", home),
                      _env_path(env.get("AWS_CONFIG_FILE"), home / ".aws" / "config", home), {}, {}, {})
    for section, values in _ini(files.config).items():
        if section.startswith("sso-session "):
            files.sso_sessions[section[len("sso-session "):].strip()] = values
            continue
        if section != "default" and not section.startswith("profile "):
            continue  # botocore ignores other sections of the config file
        name = section.removeprefix("profile ").strip()
        files.profiles.setdefault(name, {}).update(values)
        files.origin.update({(name, key): files.config for key in values})
    for name, values in _ini(files.credentials).items():  # plain [name] sections here
        files.profiles.setdefault(name, {}).update(values)
        files.origin.update({(name, key): files.credentials for key in values})
    return files


def _aws_profile(env: Mapping[str, str]) -> tuple[str | None, str]:
    """(the variable that names the profile, or None; the profile). botocore reads AWS_DEFAULT_PROFILE first."""
    variable = next((v for v in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE") if env.get(v)), None)
    return variable, env[variable] if variable else "default"


def _aws_checks(ctx: _Context) -> list[Check]:
    checks = [_extra_check("aws", "extra")]
    try:
        files = _aws_files(ctx.env, ctx.home)
    except _Unparsable as exc:
        shown = _shown(exc.path, ctx.home)
        checks.append(Check("aws", "credentials", "missing", f"{shown} cannot be parsed (boto3 refuses it too)",
                            f"fix {shown}: every setting goes under a [section] header (`aws configure` rewrites it)"))
        files = _AwsFiles(Path(), Path(), {}, {}, {})
    else:
        checks.append(_aws_credentials(ctx, files))
    # the region as clients.configured_region finds it, whose last step (the AWS profile's region) asks botocore:
    # here the profile files are read directly instead
    profile = _aws_profile(ctx.env)[1]
    region = files.profiles.get(profile, {}).get("region")
    platform = (region, f"AWS profile {profile} in {_shown(files.origin[(profile, 'region')], ctx.home)}") \
        if region else None
    checks.append(_setting_check(ctx, "aws", "region", "region", "plans fail", "us-east-1", platform,
                                 f"AWS profile {profile}", "`aws configure set region us-east-1`"))
    checks.append(_setting_check(ctx, "aws", "role", "SageMaker execution role", _PLACEHOLDER,
                                 "arn:aws:iam::ACCOUNT:role/ROLE"))
    checks.append(_setting_check(ctx, "aws", "bucket", "S3 bucket for staging", _PLACEHOLDER, "BUCKET"))
    return checks


def _aws_credentials(ctx: _Context, files: _AwsFiles) -> Check:
    """The first source in botocore's default chain that would answer: environment keys, then the profile (assumed
    role, web identity, SSO, static keys, credential_process), then container credentials; the EC2 instance role
    last (not checkable offline)."""
    env, home = ctx.env, ctx.home

    def ok(detail: str) -> Check:
        return Check("aws", "credentials", "ok", detail)

    def missing(detail: str, fix: str = _AWS_LOGIN) -> Check:
        return Check("aws", "credentials", "missing", detail, fix)

    variable, profile = _aws_profile(env)
    places = f"{_shown(files.credentials, home)} or {_shown(files.config, home)}"
    if variable and profile not in files.profiles:  # botocore raises ProfileNotFound, whatever else is set
        return missing(f"{variable}={profile}, but {places} defines no such profile",
                       f"`aws configure --profile {profile}` (or `aws configure sso`), or export {variable} with "
                       "an existing profile")
    keys = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if env.get(k)]
    if len(keys) == 2:
        return ok("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY set" + (" (with AWS_SESSION_TOKEN)"
                                                                    if env.get("AWS_SESSION_TOKEN") else ""))
    if keys:
        other = "AWS_SECRET_ACCESS_KEY" if keys[0] == "AWS_ACCESS_KEY_ID" else "AWS_ACCESS_KEY_ID"
        return missing(f"{keys[0]} is set but {other} is not", f"export {other} too, or unset {keys[0]}")
    values = files.profiles.get(profile, {})
    label = f"{variable}={profile}" if variable else "profile default"

    def where(key: str) -> str:
        return _shown(files.origin[(profile, key)], home)

    role = values.get("role_arn")
    source = values.get("source_profile") or values.get("credential_source")
    if role and source:
        return ok(f"{label} assumes {role} from {source} ({where('role_arn')})")
    token_file, found_by = "", ""
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
        token_file, found_by = env["AWS_WEB_IDENTITY_TOKEN_FILE"], "AWS_WEB_IDENTITY_TOKEN_FILE/AWS_ROLE_ARN set"
    elif values.get("web_identity_token_file") and role:
        token_file, found_by = values["web_identity_token_file"], f"{label} ({where('role_arn')})"
    if token_file:
        if not _env_path(token_file, Path(token_file), home).is_file():
            return missing(f"web identity: {found_by}, but the token file {token_file} does not exist",
                           "point the token file setting at an existing file, or unset it")
        return ok(f"web identity: {found_by}")
    if values.get("sso_session") or values.get("sso_start_url"):
        return _aws_sso(profile, label, values, files, home)
    has = [k for k in ("aws_access_key_id", "aws_secret_access_key") if values.get(k)]
    if len(has) == 2:
        return ok(f"{label}: access keys in {where('aws_access_key_id')}")
    if has:
        return missing(f"{label} has {has[0]} but not the other half of the key pair ({where(has[0])})",
                       f"`aws configure --profile {profile}`")
    if values.get("credential_process"):
        return ok(f"{label}: credential_process in {where('credential_process')}")
    for container in ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        if env.get(container):
            return ok(f"container credentials ({container} set)")
    detail = (f"none in the environment or in {label}" if values else
              f"none in the environment, and no profile {profile!r} in {places}")
    vm = None if env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true" else ctx.vm  # instance role switched off
    return _no_credentials("aws", vm, detail, _AWS_LOGIN)


def _aws_sso(profile: str, label: str, values: dict[str, str], files: _AwsFiles, home: Path) -> Check:
    """An SSO profile works while `aws sso login` has a cached, unexpired token: botocore keeps it in
    ~/.aws/sso/cache/<sha1 of the sso-session name, or of the start URL for legacy profiles>.json."""
    fix = f"aws sso login --profile {profile}"
    session = values.get("sso_session")
    if session and session not in files.sso_sessions:
        return Check("aws", "credentials", "missing",
                     f"{label} uses sso_session {session}, but {_shown(files.config, home)} has no "
                     f"[sso-session {session}]", f"aws configure sso --profile {profile}")
    key = session or values.get("sso_start_url", "")
    cache = home / ".aws" / "sso" / "cache" / f"{hashlib.sha1(key.encode()).hexdigest()}.json"
    kind = f"SSO ({label}, {'sso_session ' + session if session else 'legacy sso_start_url'})"
    token = _json_file(cache)
    if token is None:
        return Check("aws", "credentials", "warn", f"{kind}, but not logged in (no {_shown(cache, home)})", fix)
    expires = _utc(token.get("expiresAt"))
    if expires is not None and expires <= datetime.now(timezone.utc):
        renew = " (botocore may renew it with its refresh token)" if session and token.get("refreshToken") else ""
        return Check("aws", "credentials", "warn",
                     f"{kind}: the login expired at {expires:%Y-%m-%d %H:%M} UTC{renew}", fix)
    until = f" until {expires:%Y-%m-%d %H:%M} UTC" if expires else ""
    return Check("aws", "credentials", "ok", f"{kind}: logged in{until}")


def _utc(value: Any) -> datetime | None:
    """SSO caches write "2024-05-01T12:00:00Z" or "...UTC"; Python 3.10's fromisoformat takes neither suffix."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(re.sub(r"(Z|UTC)$", "+00:00", value.strip()))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


# -- azure -------------------------------------------------------------------------------------------------------

_WORKSPACE_KEYS = ("subscription_id", "resource_group", "workspace")


def _azure_checks(ctx: _Context) -> list[Check]:
    return [_extra_check("azure", "extra"), _azure_credentials(ctx), _azure_workspace(ctx)]


def _azure_workspace(ctx: _Context) -> Check:
    """As workspace_of resolves it for a spec that names none: cloudtrain's profile, then the workspace's
    config.json (here or in a parent folder). Not workspace_of itself: it reads the profile through pydantic."""
    from cloudtrain.providers.azure.workspace import config_json  # no Azure SDK at import time

    found = {key: _setting(ctx, "azure", key) for key in _WORKSPACE_KEYS}
    if not all(found.values()):
        data, where = config_json() or ({}, "")
        for key in _WORKSPACE_KEYS:
            value = data.get("workspace_name" if key == "workspace" else key)
            found[key] = found[key] or ((str(value), _shown(Path(where), ctx.home)) if value else None)
    unset = [key for key, value in found.items() if not value]
    if unset:
        return Check("azure", "workspace", "warn",
                     f"{', '.join(unset)} not set (cloudtrain profile {ctx.user.profile}, config.json here or above): "
                     "fine if the job spec sets providers.azure.subscription_id/resource_group/workspace; otherwise "
                     "submit fails", "set providers.azure.subscription_id/resource_group/workspace in cloudtrain.yaml "
                                     "(or with `cloudtrain config set azure.workspace NAME` ...), or download the "
                                     "workspace's config.json into this folder")
    subscription, group, workspace = (found[key][0] for key in _WORKSPACE_KEYS)  # type: ignore[index]
    sources = sorted({value[1] for value in found.values() if value})
    return Check("azure", "workspace", "ok", f"{workspace} (resource group {group}, subscription {subscription}; "
                                             f"from {' and '.join(sources)})")


def _azure_credentials(ctx: _Context) -> Check:
    """What DefaultAzureCredential would try first that can be seen offline: a service principal in the environment,
    workload identity, a managed-identity endpoint, then the Azure CLI's login."""
    env, home = ctx.env, ctx.home

    def ok(detail: str) -> Check:
        return Check("azure", "credentials", "ok", detail)

    if env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"):
        if env.get("AZURE_CLIENT_SECRET"):
            return ok("service principal: AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET set")
        for variable, kind in (("AZURE_CLIENT_CERTIFICATE_PATH", "service principal"),
                               ("AZURE_FEDERATED_TOKEN_FILE", "workload identity")):
            path = env.get(variable)
            if not path:
                continue
            if not Path(path).is_file():
                return Check("azure", "credentials", "missing", f"{kind}: {variable}={path}, but that file does not "
                                                                "exist", f"point {variable} at the file, or unset it")
            return ok(f"{kind}: AZURE_CLIENT_ID/AZURE_TENANT_ID set, {variable}={path}")
    for variable in ("IDENTITY_ENDPOINT", "MSI_ENDPOINT"):
        if env.get(variable):
            return ok(f"managed identity ({variable} set)")
    profile_file = _env_path(env.get("AZURE_CONFIG_DIR"), home / ".azure", home) / "azureProfile.json"
    profile = _json_file(profile_file, encoding="utf-8-sig")  # az writes this file with a byte-order mark
    subscriptions = [s for s in (profile or {}).get("subscriptions") or [] if isinstance(s, dict)]
    if subscriptions:
        default = next((s for s in subscriptions if s.get("isDefault")), subscriptions[0])
        detail = f"Azure CLI login ({_shown(profile_file, home)}, subscription {default.get('name', '?')!r})"
        if shutil.which("az", path=env.get("PATH", "")) is None:  # DefaultAzureCredential runs `az` for tokens
            return Check("azure", "credentials", "warn", detail + ", but `az` is not on PATH",
                         "install the Azure CLI (https://aka.ms/azure-cli) or put `az` on PATH")
        return ok(detail)
    detail = "no service principal, workload identity or managed identity variables, and no Azure CLI login (" + \
        (f"{_shown(profile_file, home)} lists no subscription)" if profile_file.exists() else
         f"no {_shown(profile_file, home)})")
    partial = [v for v in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE") if env.get(v)]
    if partial:  # half a service principal: EnvironmentCredential skips it
        detail += f"; {'/'.join(partial)} set, but a service principal needs AZURE_CLIENT_ID, AZURE_TENANT_ID and " \
                  "AZURE_CLIENT_SECRET (or AZURE_CLIENT_CERTIFICATE_PATH or AZURE_FEDERATED_TOKEN_FILE)"
    return _no_credentials("azure", ctx.vm, detail, "az login")


# -- gcp ---------------------------------------------------------------------------------------------------------

def _gcp_checks(ctx: _Context) -> list[Check]:
    from cloudtrain.providers.gcp.clients import DEFAULT_REGION  # a light module: google.* loads inside calls

    root = _env_path(ctx.env.get("CLOUDSDK_CONFIG"), ctx.home / ".config" / "gcloud", ctx.home)
    gcloud = _gcloud_config(ctx.env, root)
    return [
        _extra_check("gcp", "extra"),
        _gcp_credentials(ctx, root),
        _setting_check(ctx, "gcp", "project", "project", _PLACEHOLDER, "PROJECT_ID",
                       _gcloud_setting(gcloud, "project"), "gcloud config", "`gcloud config set project PROJECT_ID`"),
        _setting_check(ctx, "gcp", "region", "region", f"cloudtrain uses {DEFAULT_REGION}", "us-central1",
                       _gcloud_setting(gcloud, "region"), "gcloud config", "`gcloud config set ai/region REGION`"),
        _setting_check(ctx, "gcp", "bucket", "GCS bucket for staging", _PLACEHOLDER, "BUCKET"),
    ]


# gcloud's own project and region: as providers/gcp/clients.gcloud_setting reads them, duplicated because that reads
# os.environ and Path.home() while doctor reads the ``env`` and ``home`` it is given (tests/test_doctor.py checks
# that both agree).
def _gcloud_config(env: Mapping[str, str], root: Path) -> configparser.ConfigParser:
    """gcloud's active configuration (<root>/configurations/config_<name>), or an empty one."""
    parser = configparser.ConfigParser()
    try:
        active = env.get("CLOUDSDK_ACTIVE_CONFIG_NAME") or (root / "active_config").read_text().strip() or "default"
        parser.read(root / "configurations" / f"config_{active}")
    except (OSError, configparser.Error):
        pass
    return parser


def _gcloud_setting(gcloud: configparser.ConfigParser, key: str) -> tuple[str, str] | None:
    for section, name in [("core", "project")] if key == "project" else [("ai", "region"), ("compute", "region")]:
        value = gcloud.get(section, name, fallback=None)
        if value:
            return value, f"gcloud config ({section}/{name})"
    return None


def _gcp_credentials(ctx: _Context, root: Path) -> Check:
    """Application Default Credentials as google.auth.default looks for them offline: GOOGLE_APPLICATION_CREDENTIALS
    (when set, the only place looked: a missing file is an error, not a fall-through), then gcloud's ADC file."""
    given, home = ctx.env.get("GOOGLE_APPLICATION_CREDENTIALS"), ctx.home
    if given:
        kind = _credential_type(Path(given))
        if kind is None:
            problem = "is not a JSON credentials file" if Path(given).is_file() else "does not exist"
            return Check("gcp", "credentials", "missing", f"GOOGLE_APPLICATION_CREDENTIALS={given}, but that file "
                                                          f"{problem}",
                         "point GOOGLE_APPLICATION_CREDENTIALS at a key file, or unset it and run "
                         "`gcloud auth application-default login`")
        return Check("gcp", "credentials", "ok", f"GOOGLE_APPLICATION_CREDENTIALS={given} ({kind})")
    adc = root / "application_default_credentials.json"
    if adc.exists():
        kind = _credential_type(adc)
        if kind is None:
            return Check("gcp", "credentials", "missing", f"{_shown(adc, home)} is not a JSON credentials file",
                         "gcloud auth application-default login")
        return Check("gcp", "credentials", "ok", f"gcloud application-default login ({_shown(adc, home)}, {kind})")
    detail = f"no GOOGLE_APPLICATION_CREDENTIALS and no {_shown(adc, home)}"
    if (root / "credentials.db").exists():
        detail += " (`gcloud auth login` is done, but Application Default Credentials are a separate login)"
    return _no_credentials("gcp", ctx.vm, detail, "gcloud auth application-default login")


def _credential_type(path: Path) -> str | None:
    """The ``type`` of a Google credentials file (service_account, authorized_user, external_account ...), the one
    field worth showing: the others hold keys and tokens."""
    kind = (_json_file(path) or {}).get("type")
    return kind if isinstance(kind, str) and kind else None


_AREA_CHECKS: dict[str, Callable[[_Context], list[Check]]] = {
    "local": _local_checks, "aws": _aws_checks, "azure": _azure_checks, "gcp": _gcp_checks}
