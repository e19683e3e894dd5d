"""`cloudtrain doctor`: which extras are installed and which credentials and settings each provider would find, with
the fix for each missing piece. Each provider's own checks live in its folder (``doctor.py``, declared in its registry
entry); this module runs them, checks Python and cloudtrain's own files, and holds the helpers they share.

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
own identity (an instance role, a managed identity, a service account) comes from the metadata server, which an
offline check cannot ask. Whether this is such a VM each provider tells from the firmware's vendor strings (its
``cloud_vm`` hook, reading DMI files through `dmi`).

Settings (region, role, bucket, project, workspace) resolve as the providers resolve them: the project's job spec
(``./cloudtrain.yaml``, its ``providers:`` block, as every other command reads it), the environment, then
cloudtrain's profile (``cloudtrain.spec.settings``), then the platform's own tools (AWS profile, gcloud config, the
workspace's config.json). A spec that cannot be read is reported as a check of its own.
"""

from __future__ import annotations

import configparser
import functools
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from cloudtrain import registry
from cloudtrain.errors import ProviderNotFound
from cloudtrain.job_types import Check
from cloudtrain.regular_files import read_text
from cloudtrain.spec import settings as config

PACKAGE = "cloudtrain"
PLACEHOLDER = "plans show a placeholder and submit refuses"  # what an unset staging setting means, in a check
_COLORS = {"ok": "\033[32m", "warn": "\033[33m", "missing": "\033[31m"}
_RESET = "\033[0m"


def diagnose(providers: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
             home: Path | None = None) -> list[Check]:
    """Checks for ``providers`` (default: all four), reading ``env`` (default: os.environ) and the files under
    ``home`` (default: the user's home) in place of the real ones where given. Python and cloudtrain's own config
    file are always checked. Workspace config.json files are looked for from the current directory up."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    areas = registry.names()
    wanted = list(areas) if providers is None else list(providers)
    unknown = [p for p in wanted if p not in areas]
    if unknown:
        raise ProviderNotFound(f"doctor knows no provider {unknown[0]!r}", remedy="choose from " + ", ".join(areas))
    spec, spec_check = _project_spec(areas)
    ctx = Context(env, home, _cloud_vm(), _user_config(env, home, areas), spec)
    checks = [_python_check(), _config_check(ctx), *([spec_check] if spec_check else [])]
    for area in areas:
        if area in wanted:
            decl = registry.declaration(area)
            checks += decl.load("doctor")(ctx) if decl.doctor else [extra_check(area, "extra")]
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
    project = _source_project(Path(__file__).resolve().parent.parent.parent / "pyproject.toml")
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


def extra_check(area: str, name: str, more_fix: str = "") -> Check:
    """The provider's pip extra (its name from the provider registry, its distributions from cloudtrain's own
    requirements): each distribution installed, at its minimum version or newer. A plugin's (another
    distribution's): the modules it declares it needs, importable."""
    decl = registry.declaration(area)
    if decl.distribution != PACKAGE or not decl.extra:
        return _modules_check(area, name, decl)
    extra = decl.extra
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


def _modules_check(area: str, name: str, decl: registry.Declaration) -> Check:
    import importlib.util

    def found(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    missing = [m for m in decl.requires if not found(m)]
    what = f"'{decl.distribution}[{decl.extra}]'" if decl.extra else decl.distribution
    if missing:
        return Check(area, name, "missing", "not importable: " + ", ".join(missing), f"pip install {what}")
    return Check(area, name, "ok", f"{decl.distribution}" + (f" ({', '.join(decl.requires)})" if decl.requires
                                                             else ": nothing more to install"))


# -- shared helpers ----------------------------------------------------------------------------------------------

_DMI = Path("/sys/class/dmi/id")


def dmi(name: str, folder: Path | None = None) -> str:
    """A firmware string (``sys_vendor``, ``product_name``, ``chassis_asset_tag`` ...; or a file of another
    ``folder``), "" when unreadable: what a provider's ``cloud_vm`` hook reads to tell its own cloud's VMs, without
    asking a metadata server."""
    try:
        return ((folder or _DMI) / name).read_text().strip()
    except (OSError, ValueError):
        return ""


def _cloud_vm() -> str | None:
    """The provider whose cloud this machine is a VM of (its ``cloud_vm`` hook says so), else None. Tests replace
    it."""
    for name in registry.names():
        decl = registry.declaration(name)
        if decl.cloud_vm and decl.load("cloud_vm")():
            return name
    return None


def env_path(value: str | None, default: Path, home: Path) -> Path:
    """A path named by an environment variable ("~" meaning ``home``), else the default."""
    if not value:
        return default
    if value == "~" or value.startswith("~/"):
        return home / value[2:]
    return Path(value)


def shown(path: Path, home: Path) -> str:
    try:
        return "~/" + path.relative_to(home).as_posix()
    except ValueError:
        return str(path)


def json_file(path: Path, encoding: str = "utf-8") -> dict[str, Any] | None:
    """A JSON object from a file; None when absent or unreadable (the error is never shown: it may quote a secret)."""
    try:
        data = json.loads(read_text(path, encoding=encoding))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Unparsable(Exception):
    def __init__(self, path: Path) -> None:
        self.path = path


def ini(path: Path) -> dict[str, dict[str, str]]:
    """The sections of an INI file ({} when absent). Raises Unparsable without the parser's message, which quotes
    the offending line: in a credentials file that may be a secret."""
    try:
        text = read_text(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raise Unparsable(path) from None
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\0none")
    try:
        parser.read_string(text)
    except configparser.Error:
        raise Unparsable(path) from None
    return {section: dict(parser[section]) for section in parser.sections()}


def no_credentials(area: str, vm: str | None, detail: str, fix: str, identity: str) -> Check:
    """No credentials to be seen: "missing", or "warn" on the same cloud's VM (see the module's docstring), whose
    ``identity`` ("an EC2 instance, whose instance role") may supply them."""
    if vm == area:
        return Check(area, "credentials", "warn", f"{detail}; this machine is {identity} may supply "
                                                  "credentials (not checked: that needs the metadata server)", fix)
    return Check(area, "credentials", "missing", detail, fix)


# -- settings: the environment, cloudtrain's profile, the platform's tools --------------------------------------

@dataclass(frozen=True)
class UserConfig:
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
class Context:
    env: Mapping[str, str]
    home: Path
    vm: str | None  # the cloud whose VM this is
    user: UserConfig
    spec: dict[str, dict[str, Any]]  # the providers: block of ./cloudtrain.yaml, by provider


def _project_spec(areas: list[str]) -> tuple[dict[str, dict[str, Any]], Check | None]:
    """The project's spec here, as plan and submit read it: its provider settings, and a check saying which file
    (or why it cannot be used). No spec file: ({}, None)."""
    from cloudtrain.errors import SpecError
    from cloudtrain.spec.files import project_options, project_spec

    path = project_spec()
    if path is None:
        return {}, None
    try:
        found = {area: project_options(area) for area in areas}
    except SpecError as exc:
        return {}, Check(PACKAGE, "spec", "missing", f"./{path} cannot be read: {exc.message}",
                         exc.remedy or "fix it (`cloudtrain plan` shows the same error)")
    return found, Check(PACKAGE, "spec", "ok", f"./{path}: plan and submit use it; settings below include its "
                                               "providers: block")


def _user_config(env: Mapping[str, str], home: Path, areas: list[str]) -> UserConfig:
    # config_path's own rules (CLOUDTRAIN_CONFIG, XDG_CONFIG_HOME ...), with ``home`` standing for the user's home
    path = config.config_path({**env, "XDG_CONFIG_HOME": env.get("XDG_CONFIG_HOME") or str(home / ".config")})
    # profile_name() also knows the CLI's --profile, but reads os.environ: used only when that is the env in use
    profile = config.profile_name() if env is os.environ else env.get(config.PROFILE_ENV) or config.DEFAULT_PROFILE
    try:
        text = read_text(path)  # never a FIFO: opening one would wait for a writer
    except FileNotFoundError:
        return UserConfig(path, profile, {}, "")
    except (OSError, ValueError):
        return UserConfig(path, profile, {}, "cannot be read")
    import yaml  # only when the file exists

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return UserConfig(path, profile, {}, "is not valid YAML")
    if not isinstance(data, dict):
        return UserConfig(path, profile, {}, "must map profile names to provider settings")
    for name, blocks in data.items():
        if not isinstance(blocks, dict) or not all(p in areas and isinstance(b, (dict, type(None)))
                                                   for p, b in blocks.items()):
            return UserConfig(path, profile, {}, f"profile {name!r} must map providers "
                                                  f"({', '.join(areas)}) to settings")
    return UserConfig(path, profile, data, "")


def _config_check(ctx: Context) -> Check:
    user, place = ctx.user, shown(ctx.user.path, ctx.home)
    if user.problem:
        return Check(PACKAGE, "config", "missing", f"{place} {user.problem}: cloudtrain stops on it when it looks up "
                                                   "a setting there",
                     f"fix {place} (`cloudtrain config set` writes valid entries), or remove it")
    if not user.path.exists():
        return Check(PACKAGE, "config", "ok", f"no {place} (optional: `cloudtrain config set aws.region us-east-1` "
                                              "writes one)")
    if user.profile in user.data:
        return Check(PACKAGE, "config", "ok", f"profile {user.profile} in {place}")
    others = ", ".join(map(str, user.data)) or "none"
    if user.profile == config.DEFAULT_PROFILE:
        return Check(PACKAGE, "config", "ok", f"{place}: no profile {user.profile!r} (profiles: {others})")
    return Check(PACKAGE, "config", "warn", f"profile {user.profile!r} is selected, but {place} has none of that name "
                                            f"(profiles: {others})",
                 f"choose an existing profile, or add settings to {user.profile!r} with `cloudtrain config set`")


def setting(ctx: Context, provider: str, key: str, platform: tuple[str, str] | None = None) -> tuple[str, str] | None:
    """(value, where) as a plan resolves a setting (config.resolve): the project's spec, the environment, the
    profile, then what the platform's tools hold (``platform``, read by the provider's checks from ``ctx.home``)."""
    found = config.resolve(provider, key, spec=ctx.spec.get(provider, {}).get(key),
                           spec_source=f"./cloudtrain.yaml providers.{provider}.{key}", env=ctx.env,
                           profile=(ctx.user.settings(provider), f"cloudtrain profile {ctx.user.profile}"),
                           platform=platform)
    where = found.source.removeprefix("env ")  # doctor names the variable alone
    return (str(found.value), where) if found.found else None


def setting_check(ctx: Context, provider: str, key: str, what: str, unset: str, example: str,
                   platform: tuple[str, str] | None = None, platform_place: str = "", platform_fix: str = "") -> Check:
    """A provider setting: found (value and where), else a warning naming every place looked in and every way to set
    it. A warning, not "missing": a spec given with -f may still set it."""
    found = setting(ctx, provider, key, platform)
    if found:
        return Check(provider, key, "ok", f"{found[0]} ({found[1]})")
    variables = config.env_names(provider, key)
    places = ["./cloudtrain.yaml", *variables, f"cloudtrain profile {ctx.user.profile}",
              *([platform_place] if platform_place else [])]
    looked = ", ".join(places[:-1]) + " or " + places[-1] if len(places) > 1 else places[0]
    fixes = [f"set providers.{provider}.{key} in cloudtrain.yaml", f"`cloudtrain config set {provider}.{key} "
                                                                    f"{example}`"]
    fixes += [f"export {variables[0]}={example}"] if variables else []
    fixes += [platform_fix] if platform_fix else []
    return Check(provider, key, "warn", f"no {what} in {looked}: fine if the job spec you submit sets "
                                        f"providers.{provider}.{key}; otherwise {unset}", ", or ".join(fixes))
