"""`cloudtrain doctor`: which extras are installed and which credentials and settings each provider would find, with
the fix for each missing piece. Each provider's own checks live in its folder (``doctor.py``, declared in its registry
entry); this module runs them and checks Python and cloudtrain's own files; the helpers they share are in
cloudtrain/platforms/doctor_kit.py.

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

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain import registry
from cloudtrain.errors import ProviderNotFound
from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import (  # the helpers providers' checks share, and what tests reach here
    _MINIMUM,
    PACKAGE,
    Context,
    UserConfig,
    _at_least,
    _requirements,
    extra_check,
    shown,
)
from cloudtrain.regular_files import read_text
from cloudtrain.spec import settings as config

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



def _python_check() -> Check:
    required = _requirements()[1]
    here = ".".join(str(n) for n in sys.version_info[:3])
    minimum = _MINIMUM.search(required)
    if minimum and not _at_least(here, minimum.group(1)):
        return Check(PACKAGE, "python", "missing", f"Python {here}; cloudtrain needs {required}",
                     f"use Python {minimum.group(1)} or newer")
    return Check(PACKAGE, "python", "ok", f"Python {here}" + (f" (cloudtrain needs {required})" if required else ""))



def _cloud_vm() -> str | None:
    """The provider whose cloud this machine is a VM of (its ``cloud_vm`` hook says so), else None. Tests replace
    it."""
    for name in registry.names():
        decl = registry.declaration(name)
        if decl.cloud_vm and decl.load("cloud_vm")():
            return name
    return None


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

