"""The MLClient for a spec's workspace, its credential, and Azure's errors in cloudtrain's words."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cloudtrain.errors import (
    CapacityError,
    CloudtrainError,
    CredentialsError,
    HandleError,
    SpecError,
    TransientError,
    UserError,
)

_LOGIN_HINT = "run `az login` (or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, or use a managed identity)"
# Test and emulator seam, like AWS_ENDPOINT_URL: every https request of the Azure ML client goes to this base URL,
# with a static token (blob traffic keeps its own, SAS-signed, URLs).
ENDPOINT_ENV = "CLOUDTRAIN_AZURE_ENDPOINT"


def config_json() -> tuple[dict[str, Any], str] | None:
    """The workspace ``config.json`` as the Azure ML tools find it (``.azureml/config.json`` or ``config.json`` in
    this folder or a parent), with its path."""
    from cloudtrain import safe_json

    for folder in [Path.cwd(), *Path.cwd().parents]:
        for candidate in (folder / ".azureml" / "config.json", folder / "config.json"):
            if candidate.is_file():
                try:
                    data = safe_json.load(candidate)
                except (OSError, ValueError):  # safe_json.UnreadableJson: not JSON, nested 100,000 deep ...
                    continue
                if isinstance(data, dict) and "subscription_id" in data:
                    return data, str(candidate)
    return None


def workspace_of(options: Any, setting: Callable[[str, Any], Any]) -> tuple[str, str, str]:
    """(subscription, resource group, workspace): the spec's options, else the cloudtrain profile's, else the
    workspace's ``config.json`` (the ``settings`` hook), each as ``setting(key, the spec's value)`` resolves it (a
    plan's context, or Provider.setting: the one resolver)."""
    found = {"subscription_id": setting("subscription_id", options.subscription_id),
             "resource_group": setting("resource_group", options.resource_group),
             "workspace_name": setting("workspace", options.workspace)}
    missing = [k for k, v in found.items() if not v]
    if missing:
        names = {"subscription_id": "subscription_id", "resource_group": "resource_group",
                 "workspace_name": "workspace"}
        raise SpecError(f"no Azure ML workspace: {', '.join(names[m] for m in missing)} not set",
                        field=f"providers.azure.{names[missing[0]]}",
                        remedy="set providers.azure.subscription_id/resource_group/workspace (in the spec, or once "
                               "with `cloudtrain config set azure.workspace NAME` ...), or download the workspace's "
                               "config.json into this folder")
    return str(found["subscription_id"]), str(found["resource_group"]), str(found["workspace_name"])


class _StaticToken:
    def get_token(self, *_scopes: str, **_kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("cloudtrain-emulator", int(time.time()) + 3600)


def _redirecting_transport(base: str) -> Any:
    from azure.core.pipeline.transport import RequestsTransport

    class Redirect(RequestsTransport):
        def send(self, request: Any, **kwargs: Any) -> Any:
            if request.url.startswith("https://"):
                rest = request.url[len("https://"):]
                request.url = f"{base.rstrip('/')}/{rest}"  # host kept as the first path segment
            return super().send(request, **kwargs)

    return Redirect()


def ml_client(scope: tuple[str, ...], credential: Any = None, transport: Any = None) -> Any:
    """The MLClient of the workspace ``scope`` names: (subscription, resource group, workspace)."""
    from azure.ai.ml import MLClient

    subscription, group, workspace = scope
    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint and transport is None:
        transport, credential = _redirecting_transport(endpoint), credential or _StaticToken()
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    kwargs: dict[str, Any] = {"transport": transport} if transport is not None else {}
    # upload progress bars only where a person watches (a terminal), never in logs or pipes
    return MLClient(credential, subscription, group, workspace, show_progress=sys.stderr.isatty(), **kwargs)


# azure-ai-ml has no exception type for quota or capacity: the service answers an HttpResponseError (ARM error
# codes QuotaExceeded, OperationNotAllowed "... exceed approved ... quota") or fails the job ("not enough capacity",
# AllocationFailed); both are matched on their words.
CAPACITY = re.compile(r"quota|not enough capacity|insufficient capacity|AllocationFailed|OutOfCapacity",
                      re.IGNORECASE)


@contextmanager
def azure_errors(action: str) -> Iterator[None]:
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    try:
        yield
    except (ServiceRequestError, ServiceResponseError) as exc:  # no answer: a timeout, a reset connection
        raise TransientError(f"{action}: {str(exc).splitlines()[0][:200]}",
                             remedy="check the network; try again") from None
    except ClientAuthenticationError as exc:
        raise CredentialsError(f"{action}: Azure sign-in failed ({str(exc).splitlines()[0][:200]})",
                               remedy=_LOGIN_HINT) from None
    except ResourceNotFoundError as exc:
        raise HandleError(f"{action}: not found ({str(exc).splitlines()[0][:200]})",
                          remedy="check the handle and the workspace (`cloudtrain list --provider azure`)") from None
    except HttpResponseError as exc:
        if exc.status_code in (401, 403):
            raise CredentialsError(f"{action}: Azure refused the request ({exc.status_code}: "
                                   f"{str(exc).splitlines()[0][:200]})", remedy=_LOGIN_HINT) from None
        if exc.status_code == 429 or (exc.status_code or 0) >= 500:
            raise TransientError(f"{action}: {str(exc).splitlines()[0][:300]}",
                                 remedy="try again; if it persists, check the Azure status page") from None
        if exc.status_code and CAPACITY.search(str(exc)):
            raise CapacityError(f"{action}: {str(exc).splitlines()[0][:300]}",
                                remedy="request more quota for this VM family in the region, or choose another "
                                       "compute, region or provider") from None
        if exc.status_code and 400 <= exc.status_code < 500:
            raise UserError(f"{action}: {str(exc).splitlines()[0][:300]}") from None
        raise CloudtrainError(f"{action}: {str(exc).splitlines()[0][:300]}",
                              remedy="try again; if it persists, check the job in Azure ML studio") from None
    except Exception as exc:  # azure.identity's CredentialUnavailableError and friends
        if type(exc).__name__ in ("CredentialUnavailableError", "ClientAuthenticationError"):
            raise CredentialsError(f"{action}: no Azure credentials found", remedy=_LOGIN_HINT) from None
        raise
