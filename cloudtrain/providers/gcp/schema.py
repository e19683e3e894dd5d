"""Check a CustomJob body offline, before anything is sent: field names, value kinds and enum values as the Vertex
API defines them, plus the limits the proto cannot express (labels, display name, environment size).

The field and enum definitions are a snapshot taken from google-cloud-aiplatform's own ``aiplatform_v1`` types
(``custom_job_schema.json``, next to this file): importing those types takes seconds, reading the snapshot a few
milliseconds, so `cloudtrain plan` stays fast. ``derive()`` rebuilds the snapshot from the installed SDK (a test
compares the two); ``submit`` parses the body with the real types before sending it.

    python -m cloudtrain.providers.gcp.schema > cloudtrain/providers/gcp/custom_job_schema.json
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from cloudtrain.errors import UserError

SNAPSHOT = Path(__file__).with_name("custom_job_schema.json")
ROOT = "google.cloud.aiplatform.v1.CustomJob"
_WELL_KNOWN = {"google.protobuf.Duration": "duration", "google.protobuf.Timestamp": "timestamp",
               "google.protobuf.Struct": "any", "google.protobuf.Value": "any", "google.protobuf.Any": "any"}
_SCALARS = {1: "float", 2: "float", 3: "int", 4: "int", 5: "int", 6: "int", 7: "int", 8: "bool", 9: "string",
            12: "bytes", 13: "int", 15: "int", 16: "int", 17: "int", 18: "int"}  # protobuf FieldDescriptor types

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^\d+(\.\d{1,9})?s$")
MAX_LABELS = 64
MAX_ENV = 100  # ContainerSpec.env: "Maximum limit is 100"
MAX_DISPLAY_NAME = 128


def derive() -> dict[str, Any]:
    """The snapshot, from the installed SDK's descriptors (imports google.cloud.aiplatform_v1: seconds)."""
    from cloudtrain.providers.gcp.clients import aiplatform

    CustomJob = aiplatform().CustomJob
    messages: dict[str, dict[str, Any]] = {}
    enums: dict[str, list[str]] = {}

    def kind(field: Any) -> dict[str, Any]:
        if field.message_type is not None:
            name = field.message_type.full_name
            if name in _WELL_KNOWN:
                return {"kind": _WELL_KNOWN[name]}
            if field.message_type.GetOptions().map_entry:
                value = field.message_type.fields_by_name["value"]
                return {"kind": "map", "value": kind(value)}
            visit(field.message_type)
            return {"kind": "message", "type": name}
        if field.enum_type is not None:
            enums[field.enum_type.full_name] = [v.name for v in field.enum_type.values]
            return {"kind": "enum", "type": field.enum_type.full_name}
        return {"kind": _SCALARS.get(field.type, "string")}

    def visit(descriptor: Any) -> None:
        if descriptor.full_name in messages:
            return
        fields: dict[str, Any] = {}
        messages[descriptor.full_name] = fields
        for field in descriptor.fields:
            entry = kind(field)
            is_map = entry["kind"] == "map"
            repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
            if repeated and not is_map:
                entry = {**entry, "repeated": True}
            fields[field.json_name] = entry
            if field.name != field.json_name:
                fields[field.name] = entry  # the JSON parser accepts both spellings
        messages[descriptor.full_name] = dict(sorted(fields.items()))

    visit(CustomJob.pb().DESCRIPTOR)
    return {"root": ROOT, "messages": dict(sorted(messages.items())), "enums": dict(sorted(enums.items()))}


@cache
def snapshot() -> dict[str, Any]:
    return dict(json.loads(SNAPSHOT.read_text()))


def _value(entry: dict[str, Any], value: Any, path: str, errors: list[str], schema: dict[str, Any]) -> None:
    kind = entry["kind"]
    if entry.get("repeated"):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list")
            return
        for i, item in enumerate(value):
            _value({**entry, "repeated": False}, item, f"{path}[{i}]", errors, schema)
        return
    if kind == "message":
        _message(entry["type"], value, path, errors, schema)
    elif kind == "map":
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping")
            return
        for key, item in value.items():
            _value(entry["value"], item, f"{path}[{key!r}]", errors, schema)
    elif kind == "enum":
        allowed = schema["enums"][entry["type"]]
        if value not in allowed:
            errors.append(f"{path}: {value!r} is not one of the {len(allowed)} values of {entry['type']}")
    elif kind == "string" and not isinstance(value, str):
        errors.append(f"{path}: expected a string, not {type(value).__name__}")
    elif kind == "int" and (isinstance(value, bool) or not isinstance(value, (int, str)) or
                            (isinstance(value, str) and not value.lstrip("-").isdigit())):
        errors.append(f"{path}: expected an integer, not {value!r}")
    elif kind == "bool" and not isinstance(value, bool):
        errors.append(f"{path}: expected true or false, not {value!r}")
    elif kind == "duration" and not (isinstance(value, str) and _DURATION.match(value)):
        errors.append(f"{path}: {value!r} is not a duration such as '3600s'")


def _message(name: str, value: Any, path: str, errors: list[str], schema: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        errors.append(f"{path or name}: expected an object")
        return
    fields = schema["messages"][name]
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in fields:
            errors.append(f"{where}: unknown field of {name.rsplit('.', 1)[1]}")
        else:
            _value(fields[key], item, where, errors, schema)


def _count(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0  # a wrong kind is reported by the type check


def _limits(job: dict[str, Any], errors: list[str]) -> None:
    name = job.get("displayName", "")
    if not name or len(name) > MAX_DISPLAY_NAME:
        errors.append(f"displayName: must be 1-{MAX_DISPLAY_NAME} characters (got {len(name)})")
    labels = job.get("labels") or {}
    if len(labels) > MAX_LABELS:
        errors.append(f"labels: {len(labels)} labels exceed the maximum {MAX_LABELS}")
    for key, value in labels.items():
        if not _LABEL_KEY.match(str(key)):
            errors.append(f"labels key {key!r}: must start with a lowercase letter and use at most 63 lowercase "
                          "letters, digits, '_' and '-'")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            errors.append(f"labels[{key!r}]: {value!r} must be at most 63 lowercase letters, digits, '_' and '-'")
    for i, pool in enumerate((job.get("jobSpec") or {}).get("workerPoolSpecs") or []):
        where = f"jobSpec.workerPoolSpecs[{i}]"
        if _count(pool.get("replicaCount")) < 1:
            errors.append(f"{where}.replicaCount: must be >= 1")
        machine = pool.get("machineSpec") or {}
        if machine.get("acceleratorType") and _count(machine.get("acceleratorCount")) < 1:
            errors.append(f"{where}.machineSpec.acceleratorCount: must be >= 1 with an acceleratorType")
        env = (pool.get("containerSpec") or {}).get("env") or []
        if len(env) > MAX_ENV:
            errors.append(f"{where}.containerSpec.env: {len(env)} items exceeds the maximum {MAX_ENV}")
        for var in env:
            if isinstance(var, dict) and not _ENV_NAME.match(str(var.get("name", ""))):
                errors.append(f"{where}.containerSpec.env: {var.get('name')!r} is not a variable name")


def request_errors(job: dict[str, Any]) -> list[str]:
    """Every problem found with a CustomJob body (REST JSON), one line each (empty: valid)."""
    schema = snapshot()
    errors: list[str] = []
    _message(schema["root"], job, "", errors, schema)
    _limits(job, errors)
    return errors


def check_request(job: dict[str, Any]) -> None:
    errors = request_errors(job)
    if errors:
        raise UserError("the CustomJob would be rejected:\n    " + "\n    ".join(errors),
                        remedy="fix the spec fields behind those request fields (see `cloudtrain plan "
                               "--provider gcp -o json`)")


if __name__ == "__main__":
    print(json.dumps(derive(), indent=1))
