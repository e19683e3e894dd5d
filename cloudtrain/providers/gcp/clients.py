"""Project and region from the spec, the environment or gcloud's own config (read as a file, offline); Application
Default Credentials; the Vertex and Cloud Logging clients; Google errors in cloudtrain's words.

Test/dev knobs: ``CLOUDTRAIN_VERTEX_ENDPOINT`` and ``CLOUDTRAIN_GCP_LOGGING_ENDPOINT`` point the clients at another
endpoint (a plain http:// one is a local fake and gets anonymous credentials).
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cloudtrain.errors import CapacityError, CloudtrainError, CredentialsError, HandleError, TransientError, UserError

DEFAULT_REGION = "us-central1"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
_LOGIN_HINT = "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a key file)"


def _gcloud_config() -> configparser.ConfigParser:
    """gcloud's active configuration (~/.config/gcloud/configurations/config_<name>), or an empty one."""
    parser = configparser.ConfigParser()
    root = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    active = os.environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not active:
        with suppress(OSError):  # no active_config: gcloud itself uses the configuration named "default"
            active = (root / "active_config").read_text().strip()
    with suppress(OSError, configparser.Error):
        parser.read(root / "configurations" / f"config_{active or 'default'}")
    return parser


def gcloud_setting(key: str) -> tuple[str, str] | None:
    """(value, where) of gcloud's own setting for ``project`` (core/project) or ``region`` (ai/region, else
    compute/region), read from its config file."""
    config = _gcloud_config()
    sections = [("core", "project")] if key == "project" else [("ai", "region"), ("compute", "region")]
    for section, name in sections:
        value = config.get(section, name, fallback=None)
        if value:
            return value, f"gcloud config ({section}/{name})"
    return None


def vertex_endpoint(region: str, override: str | None = None) -> str:
    return override or os.environ.get("CLOUDTRAIN_VERTEX_ENDPOINT") or f"{region}-aiplatform.googleapis.com"


def logging_endpoint(override: str | None = None) -> str:
    return override or os.environ.get("CLOUDTRAIN_GCP_LOGGING_ENDPOINT") or "https://logging.googleapis.com"


def credentials_for(endpoint: str, given: Any = None) -> Any:
    """Explicit credentials, anonymous ones for a local http:// endpoint, else Application Default Credentials."""
    if given is not None:
        return given
    if endpoint.startswith("http://"):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth

    with gcp_errors("finding Google credentials"):
        creds, _ = google.auth.default(scopes=SCOPES)
    return creds


def aiplatform() -> Any:
    """google.cloud.aiplatform_v1, imported on first use (seconds). Through importlib on purpose: the package is
    typed, and a static import would make mypy analyse all of it and shadow the untyped google.cloud.storage."""
    import importlib

    return importlib.import_module("google.cloud.aiplatform_v1")


def job_client(endpoint: str, credentials: Any) -> Any:
    return aiplatform().JobServiceClient(transport="rest", credentials=credentials,
                                         client_options={"api_endpoint": endpoint})


def http_session(credentials: Any) -> Any:
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(credentials)


def _code(exc: Any) -> str:
    return str(getattr(exc.grpc_status_code, "name", None) or exc.code or "?")


# How Vertex words a refusal for capacity, at create or in a job's error (verified against api_core's exception
# classes: RESOURCE_EXHAUSTED is api.ResourceExhausted, HTTP 429, whose message names the quota metric).
CAPACITY = re.compile(r"resources are insufficient in region|RESOURCE_EXHAUSTED|quota metrics? exceed|"
                      r"exceeded quota|insufficient.*capacity", re.IGNORECASE)


@contextmanager
def gcp_errors(action: str, create: bool = False) -> Iterator[None]:
    """Missing or expired credentials and refused calls become one-line errors with the fix. RESOURCE_EXHAUSTED
    (HTTP 429) is a quota: a refusal for capacity when it answers a create (``create``), throttling elsewhere."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    try:
        yield
    except api.ResourceExhausted as exc:
        if create:
            raise CapacityError(f"{action}: RESOURCE_EXHAUSTED: {exc.message}",
                                remedy="request more quota for this machine and accelerator in the region, or "
                                       "choose another region or provider") from None
        raise TransientError(f"{action}: throttled (RESOURCE_EXHAUSTED: {exc.message})",
                             remedy="try again in a minute") from None
    except (api.FailedPrecondition, api.InvalidArgument) as exc:
        if create and CAPACITY.search(str(exc.message)):
            raise CapacityError(f"{action}: {_code(exc)}: {exc.message}",
                                remedy="choose another region or provider") from None
        raise UserError(f"{action}: {_code(exc)}: {exc.message}",
                        remedy="check the plan (`cloudtrain plan -p gcp -o json`) against the message") from None
    except (api.ServerError, api.TooManyRequests, api.DeadlineExceeded, api.RetryError) as exc:
        raise TransientError(f"{action}: {exc}", remedy="try again; if it persists, check the Vertex AI status "
                                                        "page") from None
    except auth.InvalidOperation as exc:  # the endpoint answered 401 to anonymous credentials
        raise CredentialsError(f"{action}: the endpoint refused anonymous credentials ({exc})",
                               remedy=_LOGIN_HINT) from None
    except auth.DefaultCredentialsError as exc:
        raise CredentialsError(f"{action}: no Google credentials found ({str(exc).splitlines()[0]})",
                               remedy=_LOGIN_HINT) from None
    except auth.RefreshError as exc:
        raise CredentialsError(f"{action}: the Google credentials could not be refreshed (expired or revoked: "
                               f"{exc})", remedy=_LOGIN_HINT) from None
    except auth.GoogleAuthError as exc:
        raise CredentialsError(f"{action}: {exc}", remedy=_LOGIN_HINT) from None
    except api.Unauthenticated as exc:
        raise CredentialsError(f"{action}: Google refused the credentials (UNAUTHENTICATED: {exc.message})",
                               remedy=_LOGIN_HINT) from None
    except api.PermissionDenied as exc:
        raise CredentialsError(f"{action}: PERMISSION_DENIED: {exc.message}",
                               remedy="use an account with the Vertex AI User role (roles/aiplatform.user) on the "
                                      "project, and enable the Vertex AI API") from None
    except api.NotFound as exc:
        raise HandleError(f"{action}: NOT_FOUND: {exc.message}",
                          remedy="check the handle (`cloudtrain list --provider gcp`) and the project") from None
    except api.OutOfRange as exc:
        raise UserError(f"{action}: {_code(exc)}: {exc.message}",
                        remedy="check the plan (`cloudtrain plan -p gcp -o json`) against the message") from None
    except api.GoogleAPICallError as exc:
        raise CloudtrainError(f"{action}: {_code(exc)}: {exc.message}",
                              remedy="try again; if it persists, check the job in the Google Cloud console") from None
    except OSError as exc:  # requests' ConnectionError and timeouts are OSErrors
        raise TransientError(f"{action}: {exc}", remedy="check the network and the Vertex endpoint") from None
