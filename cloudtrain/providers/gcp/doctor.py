"""`cloudtrain doctor` for Vertex: Application Default Credentials as google.auth would find them offline, and the
project, region and bucket a plan would use."""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from pathlib import Path

from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import (
    PLACEHOLDER,
    Context,
    dmi,
    env_path,
    extra_check,
    json_file,
    no_credentials,
    setting_check,
    shown,
)
from cloudtrain.providers.gcp.clients import DEFAULT_REGION  # a light module: google.* loads inside calls

_IDENTITY = "a Compute Engine VM, whose service account"
def checks(ctx: Context) -> list[Check]:
    root = env_path(ctx.env.get("CLOUDSDK_CONFIG"), ctx.home / ".config" / "gcloud", ctx.home)
    gcloud = _gcloud_config(ctx.env, root)
    return [
        extra_check("gcp", "extra"),
        _gcp_credentials(ctx, root),
        setting_check(ctx, "gcp", "project", "project", PLACEHOLDER, "PROJECT_ID",
                       _gcloud_setting(gcloud, "project"), "gcloud config", "`gcloud config set project PROJECT_ID`"),
        setting_check(ctx, "gcp", "region", "region", f"cloudtrain uses {DEFAULT_REGION}", "us-central1",
                       _gcloud_setting(gcloud, "region"), "gcloud config", "`gcloud config set ai/region REGION`"),
        setting_check(ctx, "gcp", "bucket", "GCS bucket for staging", PLACEHOLDER, "BUCKET"),
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


def _gcp_credentials(ctx: Context, root: Path) -> Check:
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
            return Check("gcp", "credentials", "missing", f"{shown(adc, home)} is not a JSON credentials file",
                         "gcloud auth application-default login")
        return Check("gcp", "credentials", "ok", f"gcloud application-default login ({shown(adc, home)}, {kind})")
    detail = f"no GOOGLE_APPLICATION_CREDENTIALS and no {shown(adc, home)}"
    if (root / "credentials.db").exists():
        detail += " (`gcloud auth login` is done, but Application Default Credentials are a separate login)"
    return no_credentials("gcp", ctx.vm, detail, "gcloud auth application-default login", _IDENTITY)


def _credential_type(path: Path) -> str | None:
    """The ``type`` of a Google credentials file (service_account, authorized_user, external_account ...), the one
    field worth showing: the others hold keys and tokens."""
    kind = (json_file(path) or {}).get("type")
    return kind if isinstance(kind, str) and kind else None


def on_this_cloud() -> bool:
    """A Compute Engine VM, from the firmware's vendor strings."""
    return dmi("sys_vendor") == "Google" or dmi("product_name") == "Google Compute Engine"
