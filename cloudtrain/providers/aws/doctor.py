"""`cloudtrain doctor` for SageMaker: the first credentials botocore's default chain would find (read from the
environment and the profile files, never asked of AWS), and the region, role and bucket a plan would use."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import (
    PLACEHOLDER,
    Context,
    Unparsable,
    dmi,
    env_path,
    extra_check,
    ini,
    json_file,
    no_credentials,
    setting_check,
    shown,
)

_IDENTITY = "an EC2 instance, whose instance role"
_AWS_LOGIN = "run `aws configure` or `aws sso login`, or export AWS_PROFILE"


@dataclass
class _AwsFiles:
    credentials: Path
    config: Path
    profiles: dict[str, dict[str, str]]  # credentials-file values over config-file ones, as botocore merges them
    origin: dict[tuple[str, str], Path]  # (profile, key) -> the file it came from
    sso_sessions: dict[str, dict[str, str]]


def _aws_files(env: Mapping[str, str], home: Path) -> _AwsFiles:
    files = _AwsFiles(env_path(env.get("AWS_SHARED_CREDENTIALS_FILE"), home / ".aws" / "credentials", home),
                      env_path(env.get("AWS_CONFIG_FILE"), home / ".aws" / "config", home), {}, {}, {})
    for section, values in ini(files.config).items():
        if section.startswith("sso-session "):
            files.sso_sessions[section[len("sso-session "):].strip()] = values
            continue
        if section != "default" and not section.startswith("profile "):
            continue  # botocore ignores other sections of the config file
        name = section.removeprefix("profile ").strip()
        files.profiles.setdefault(name, {}).update(values)
        files.origin.update({(name, key): files.config for key in values})
    for name, values in ini(files.credentials).items():  # plain [name] sections here
        files.profiles.setdefault(name, {}).update(values)
        files.origin.update({(name, key): files.credentials for key in values})
    return files


def _aws_profile(env: Mapping[str, str]) -> tuple[str | None, str]:
    """(the variable that names the profile, or None; the profile). botocore reads AWS_DEFAULT_PROFILE first."""
    variable = next((v for v in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE") if env.get(v)), None)
    return variable, env[variable] if variable else "default"


def checks(ctx: Context) -> list[Check]:
    checks = [extra_check("aws", "extra")]
    try:
        files = _aws_files(ctx.env, ctx.home)
    except Unparsable as exc:
        place = shown(exc.path, ctx.home)
        checks.append(Check("aws", "credentials", "missing", f"{place} cannot be parsed (boto3 refuses it too)",
                            f"fix {place}: every setting goes under a [section] header (`aws configure` rewrites it)"))
        files = _AwsFiles(Path(), Path(), {}, {}, {})
    else:
        checks.append(_aws_credentials(ctx, files))
    # the region as clients.configured_region finds it, whose last step (the AWS profile's region) asks botocore:
    # here the profile files are read directly instead
    profile = _aws_profile(ctx.env)[1]
    region = files.profiles.get(profile, {}).get("region")
    platform = (region, f"AWS profile {profile} in {shown(files.origin[(profile, 'region')], ctx.home)}") \
        if region else None
    checks.append(setting_check(ctx, "aws", "region", "region", "plans fail", "us-east-1", platform,
                                 f"AWS profile {profile}", "`aws configure set region us-east-1`"))
    checks.append(setting_check(ctx, "aws", "role", "SageMaker execution role", PLACEHOLDER,
                                 "arn:aws:iam::ACCOUNT:role/ROLE"))
    checks.append(setting_check(ctx, "aws", "bucket", "S3 bucket for staging", PLACEHOLDER, "BUCKET"))
    return checks


def _aws_credentials(ctx: Context, files: _AwsFiles) -> Check:
    """The first source in botocore's default chain that would answer: environment keys, then the profile (assumed
    role, web identity, SSO, static keys, credential_process), then container credentials; the EC2 instance role
    last (not checkable offline)."""
    env, home = ctx.env, ctx.home

    def ok(detail: str) -> Check:
        return Check("aws", "credentials", "ok", detail)

    def missing(detail: str, fix: str = _AWS_LOGIN) -> Check:
        return Check("aws", "credentials", "missing", detail, fix)

    variable, profile = _aws_profile(env)
    places = f"{shown(files.credentials, home)} or {shown(files.config, home)}"
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
        return shown(files.origin[(profile, key)], home)

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
        if not env_path(token_file, Path(token_file), home).is_file():
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
    return no_credentials("aws", vm, detail, _AWS_LOGIN, _IDENTITY)


def _aws_sso(profile: str, label: str, values: dict[str, str], files: _AwsFiles, home: Path) -> Check:
    """An SSO profile works while `aws sso login` has a cached, unexpired token: botocore keeps it in
    ~/.aws/sso/cache/<sha1 of the sso-session name, or of the start URL for legacy profiles>.json."""
    fix = f"aws sso login --profile {profile}"
    session = values.get("sso_session")
    if session and session not in files.sso_sessions:
        return Check("aws", "credentials", "missing",
                     f"{label} uses sso_session {session}, but {shown(files.config, home)} has no "
                     f"[sso-session {session}]", f"aws configure sso --profile {profile}")
    key = session or values.get("sso_start_url", "")
    cache = home / ".aws" / "sso" / "cache" / f"{hashlib.sha1(key.encode()).hexdigest()}.json"
    kind = f"SSO ({label}, {'sso_session ' + session if session else 'legacy sso_start_url'})"
    token = json_file(cache)
    if token is None:
        return Check("aws", "credentials", "warn", f"{kind}, but not logged in (no {shown(cache, home)})", fix)
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


_HYPERVISOR = Path("/sys/hypervisor")  # older (Xen) EC2 instances: its uuid starts with "ec2"


def on_this_cloud() -> bool:
    """An EC2 instance, from the firmware's vendor string (or an older Xen instance's UUID)."""
    return dmi("sys_vendor") == "Amazon EC2" or dmi("uuid", _HYPERVISOR).lower().startswith("ec2")
