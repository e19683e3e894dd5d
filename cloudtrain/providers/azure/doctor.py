"""`cloudtrain doctor` for Azure ML: the credentials DefaultAzureCredential would try first that can be seen offline,
and the workspace a plan would use."""

from __future__ import annotations

import shutil
from pathlib import Path

from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import (
    Context,
    dmi,
    env_path,
    extra_check,
    json_file,
    no_credentials,
    setting,
    shown,
)

_IDENTITY = "an Azure VM, whose managed identity"
_WORKSPACE_KEYS = ("subscription_id", "resource_group", "workspace")


def checks(ctx: Context) -> list[Check]:
    return [extra_check("azure", "extra"), _azure_credentials(ctx), _azure_workspace(ctx)]


def _azure_workspace(ctx: Context) -> Check:
    """As workspace_of resolves it for a spec that names none: cloudtrain's profile, then the workspace's
    config.json (here or in a parent folder). Not workspace_of itself: it reads the profile through pydantic."""
    from cloudtrain.providers.azure.workspace import config_json  # no Azure SDK at import time

    found = {key: setting(ctx, "azure", key) for key in _WORKSPACE_KEYS}
    if not all(found.values()):
        data, where = config_json() or ({}, "")
        for key in _WORKSPACE_KEYS:
            value = data.get("workspace_name" if key == "workspace" else key)
            found[key] = found[key] or ((str(value), shown(Path(where), ctx.home)) if value else None)
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


def _azure_credentials(ctx: Context) -> Check:
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
    profile_file = env_path(env.get("AZURE_CONFIG_DIR"), home / ".azure", home) / "azureProfile.json"
    profile = json_file(profile_file, encoding="utf-8-sig")  # az writes this file with a byte-order mark
    subscriptions = [s for s in (profile or {}).get("subscriptions") or [] if isinstance(s, dict)]
    if subscriptions:
        default = next((s for s in subscriptions if s.get("isDefault")), subscriptions[0])
        detail = f"Azure CLI login ({shown(profile_file, home)}, subscription {default.get('name', '?')!r})"
        if shutil.which("az", path=env.get("PATH", "")) is None:  # DefaultAzureCredential runs `az` for tokens
            return Check("azure", "credentials", "warn", detail + ", but `az` is not on PATH",
                         "install the Azure CLI (https://aka.ms/azure-cli) or put `az` on PATH")
        return ok(detail)
    detail = "no service principal, workload identity or managed identity variables, and no Azure CLI login (" + \
        (f"{shown(profile_file, home)} lists no subscription)" if profile_file.exists() else
         f"no {shown(profile_file, home)})")
    partial = [v for v in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE") if env.get(v)]
    if partial:  # half a service principal: EnvironmentCredential skips it
        detail += f"; {'/'.join(partial)} set, but a service principal needs AZURE_CLIENT_ID, AZURE_TENANT_ID and " \
                  "AZURE_CLIENT_SECRET (or AZURE_CLIENT_CERTIFICATE_PATH or AZURE_FEDERATED_TOKEN_FILE)"
    return no_credentials("azure", ctx.vm, detail, "az login", _IDENTITY)


_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"  # the chassis asset tag every Azure VM reports


def on_this_cloud() -> bool:
    """An Azure VM, from the chassis asset tag its firmware reports."""
    return dmi("chassis_asset_tag") == _ASSET_TAG
