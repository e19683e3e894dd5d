"""What azure-ai-ml itself builds from a job and refuses in it: the oracle tests/test_azure_schema.py and
tests/test_azure.py hold cloudtrain's Azure ML plans to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cloudtrain.providers.azure import rest
from cloudtrain.providers.azure.provider import load_validated


def sdk_rest_body(entity: Any) -> dict[str, Any]:
    """The body of PUT .../jobs/<name> as azure-ai-ml builds it from a loaded job (before it uploads the code)."""
    job = entity._to_job() if hasattr(entity, "_to_job") else entity  # the command builder -> the job
    model = job._to_rest_object()  # runs CommandJob._validate, the SDK's checks after the schema
    data = model.as_dict() if hasattr(model, "as_dict") else model.serialize()
    return dict(json.loads(json.dumps(data, default=str)))


def sdk_rejects(job: dict[str, Any], code: Path) -> str | None:
    """Why azure-ai-ml refuses this job (load_job on its YAML, then building the request), or None."""
    try:
        sdk_rest_body(load_validated(job, str(code)))
    except Exception as exc:  # marshmallow's ValidationError (as SpecError), the SDK's ValidationException, ...
        return str(exc) or type(exc).__name__
    return None


def assert_rest_body_is_the_sdks(job: dict[str, Any], code: Path) -> None:
    """The body a plan shows is the one azure-ai-ml builds from the job (load_job, then its request)."""
    expected = sdk_rest_body(load_validated(job, str(code)))
    ours = rest.body(job)
    expected["properties"]["codeId"] = job["code"]  # the SDK's is the folder it was given; submit uploads it
    if isinstance(job["environment"], dict):  # registered at submit: the SDK's is an object's repr here
        assert job["environment"]["image"] in ours["properties"]["environmentId"]
        expected["properties"]["environmentId"] = ours["properties"]["environmentId"]
    assert ours == expected
