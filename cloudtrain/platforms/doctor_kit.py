"""The helpers each provider's doctor checks share (its ``doctor.py``, declared in its registry entry): the check of
its pip extra, firmware strings, credential files, and its settings as a plan resolves them. Below the providers, so
they import it; `cloudtrain doctor` (cloudtrain/show/doctor.py) runs the checks. Offline and light, as doctor is: no
provider SDK, no torch, no pydantic, no metadata-server call; a credential is named by the variable or file it was
found in, never by its value."""

from __future__ import annotations

import configparser
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from cloudtrain import registry, safe_json
from cloudtrain.job_types import Check
from cloudtrain.regular_files import read_text
from cloudtrain.spec import settings as config

PACKAGE = "cloudtrain"
PLACEHOLDER = "plans show a placeholder and submit refuses"  # what an unset staging setting means, in a check


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
        data = safe_json.loads(read_text(path, encoding=encoding), str(path))
    except (OSError, ValueError):  # ValueError: safe_json.UnreadableJson (nested 100,000 deep too)
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
