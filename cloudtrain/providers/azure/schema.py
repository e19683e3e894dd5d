"""Check a command job offline, without azure-ai-ml: field names, value kinds, enum values and required fields as
the SDK's ``load_job`` (marshmallow ``CommandJobSchema``) checks them, read from a snapshot of that schema
(``command_job_schema.json``, built by ``derive_schema.py``; a test keeps the two equal and checks that both reject
the same jobs). Importing the SDK takes seconds, reading the snapshot milliseconds, so `cloudtrain plan` stays fast;
``submit`` still loads the job with ``load_job`` before sending it.

One check is left to ``submit``: that a local ``code`` path exists (the code folder is written at submit).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from cloudtrain.errors import SpecError

SNAPSHOT = Path(__file__).with_name("command_job_schema.json")
_BINDING = re.compile(r"\$\{\{\s*(\S*?)\s*\}\}")  # azure-ai-ml's data binding "${{inputs.x}}"
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://[^\s/?#]+\S*$", re.IGNORECASE)  # always beside a local path: never decisive


@cache
def snapshot() -> dict[str, Any]:
    return dict(json.loads(SNAPSHOT.read_text()))


def _snake(text: str) -> str | None:
    """azure-ai-ml's camel_to_snake, which some enums compare with."""
    def convert(part: str) -> str:
        part = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", part)
        return re.sub("([a-z0-9])([A-Z])", r"\1_\2", part).lower()
    if not text:
        return None
    return ",".join(convert(t.strip()) for t in text.split(",")) if "," in text else convert(text)


def _cased(value: str, casing: str) -> str | None:
    return value.lower() if casing == "lower" else _snake(value) if casing == "snake" else value


def _versioned_ref(value: Any, entry: dict[str, Any], constants: dict[str, Any]) -> str | None:
    """Why an ``azureml:`` asset reference is not one, as ArmVersionedStr decides (None: it is)."""
    prefix = constants["arm_prefix"]
    if not isinstance(value, str) or not value.startswith(prefix):
        return f"{value!r} does not start with {prefix!r}"
    ref = value[len(prefix):]
    if not ref or re.match(constants["versioned_arm_id"], ref) or re.match(constants["registry_version"], ref):
        return None
    if re.match(constants["resource_id"].format(entry["asset"]), ref, re.IGNORECASE):
        return f"{value!r} is an ARM id without a version"
    if "/" in ref and ref[0] != "/":
        return f"{value!r}: an ARM id must start with '/'"
    label = ref.rpartition("@")[2] if "@" in ref else ""
    version = ":".join(ref.split(":")[1:]) if not label else ""
    if label or version or entry["default_version"]:
        return None
    return f"{value!r} names no version (azureml:NAME:VERSION or azureml:NAME@LABEL)"


def _scalar(entry: dict[str, Any], value: Any, constants: dict[str, Any]) -> str | None:
    """Why ``value`` does not load as this non-container kind (None: it does)."""
    kind = entry["kind"]
    if kind == "any":
        return None
    if kind == "int":
        if value is True or value is False or (entry["strict"] and not isinstance(value, int)):
            return f"expected an integer, not {value!r}"
        try:
            int(value)
        except (TypeError, ValueError, OverflowError):
            return f"expected an integer, not {value!r}"
        return None
    if kind == "float":
        if value is True or value is False or (entry["strict"] and not isinstance(value, float)):
            return f"expected a number, not {value!r}"
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return f"expected a number, not {value!r}"
        return None if entry["allow_nan"] or math.isfinite(number) else f"{value!r} is not a finite number"
    if kind == "bool":
        try:
            known = value in constants["truthy"] or value in constants["falsy"]
        except TypeError:
            known = False
        return None if known else f"expected true or false, not {value!r}"
    if kind == "version":
        return None if isinstance(value, (str, int, float)) else f"expected a version, not {value!r}"
    if kind == "arm_versioned":
        return _versioned_ref(value, entry, constants)
    if not isinstance(value, (str, bytes)):
        return f"expected a string, not {type(value).__name__}"
    text = value if isinstance(value, str) else ""
    if kind == "enum":
        if _cased(text, entry["casing"]) not in entry["values"]:
            return f"{value!r} is not one of {', '.join(entry['values'])}"
        return None
    if kind == "internal_registry":
        text = text.replace(constants["feeds_prefix"], constants["registry_prefix"], 1)
    prefix = {"arm": constants["arm_prefix"], "registry": constants["registry_prefix"],
              "internal_registry": constants["registry_prefix"], "git": "git+"}.get(kind)
    if prefix is not None and not text.startswith(prefix):
        return f"{value!r} does not start with {prefix!r}"
    if kind == "binding" and not _BINDING.search(text):
        return f"{value!r} is not a data binding such as '${{{{inputs.x}}}}'"
    if kind == "url" and not _URL.match(text):
        return f"{value!r} is not a URL"
    return None  # string, local_path (its existence is checked at submit), and the prefixes above


class _Checker:
    def __init__(self, snap: dict[str, Any]) -> None:
        self.schemas, self.constants = snap["schemas"], snap["constants"]

    def value(self, entry: dict[str, Any], value: Any, path: str, errors: list[str]) -> None:
        if value is None:
            if not entry.get("nullable"):
                errors.append(f"{path}: may not be null")
            return
        kind = entry["kind"]
        if kind == "union":
            self.union(entry["of"], value, path, errors)
        elif kind == "object":
            self.object(entry["schema"], value, path, errors)
        elif kind == "map":
            if not isinstance(value, Mapping):
                errors.append(f"{path}: expected a mapping, not {type(value).__name__}")
                return
            for key, item in value.items():
                self.value(entry["key"], key, f"{path} key {key!r}", errors)
                self.value(entry["value"], item, f"{path}.{key}", errors)
        elif kind == "list":
            if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
                errors.append(f"{path}: expected a list, not {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self.value(entry["item"], item, f"{path}[{i}]", errors)
        else:
            problem = _scalar(entry, value, self.constants)
            if problem:
                errors.append(f"{path}: {problem}")

    def object(self, name: str, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, Mapping):
            errors.append(f"{path or name}: expected a mapping, not {type(value).__name__}")
            return
        schema = self.schemas[name]
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in schema["fields"]:
                self.value(schema["fields"][key], item, where, errors)
            elif (key not in schema["ignored"] or item is None) and schema["unknown"] == "raise":  # as trim_dump_only
                errors.append(f"{where}: unknown field (known: {', '.join(schema['fields'])})")
        for key in schema["required"]:
            if key not in value:
                errors.append(f"{path + '.' if path else ''}{key}: required, missing")

    def union(self, alternatives: list[dict[str, Any]], value: Any, path: str, errors: list[str]) -> None:
        """Valid when one alternative loads (the SDK tries them in turn); otherwise the closest one's complaints."""
        tried: list[tuple[dict[str, Any], list[str]]] = []
        for alternative in alternatives:
            found: list[str] = []
            self.value(alternative, value, path, found)
            if not found:
                return
            tried.append((alternative, found))
        mapping = isinstance(value, Mapping)
        objects = [self.schemas[a["schema"]]["fields"] for a, _ in tried if a["kind"] == "object"]
        types = [fields["type"] for fields in objects if fields.get("type", {}).get("kind") == "enum"]
        if mapping and objects and len(types) == len(objects) and isinstance(value.get("type"), str):
            known = [v for t in types for v in t["values"]]
            if not any(_cased(value["type"], t["casing"]) in t["values"] for t in types):
                # a discriminated union: say which types there are
                errors.append(f"{path}.type: {value['type']!r} is not one of {', '.join(known)}")
                return
        shaped = [found for a, found in tried if (a["kind"] in ("object", "map")) == mapping]
        candidates: list[list[str]] = shaped or [found for _, found in tried]
        if mapping:  # the object closest to loading
            closest: list[str] = min(candidates, key=len)
            errors.extend(closest)
            return
        reasons = dict.fromkeys(e.removeprefix(f"{path}: ") for found in candidates for e in found)
        errors.append(f"{path}: " + "; or ".join(reasons))


def _entity_errors(job: dict[str, Any]) -> list[str]:
    """What the SDK's CommandJob checks after the schema, before it sends the job (``_validate``)."""
    errors = []
    command, inputs = job.get("command"), job.get("inputs") or {}
    if isinstance(command, str) and isinstance(inputs, Mapping):
        optional = set(re.findall(r"\[[\w\.\s-]*\${{inputs\.([\w\.-]+)}}]", command))
        for key in re.findall(r"\${{inputs\.([\w\.-]+)}}", command):
            if inputs.get(key) is None and key not in optional:
                errors.append(f"command: uses ${{{{inputs.{key}}}}}, which inputs does not define")
    environment = job.get("environment")
    if isinstance(environment, Mapping) and (
            (environment.get("image") is None and environment.get("build") is None)
            or (environment.get("image") and environment.get("build"))):
        errors.append("environment: an inline environment needs an image or a build, not both")
    return errors


def job_errors(job: dict[str, Any]) -> list[str]:
    """Every problem azure-ai-ml's load_job would find in this command job (a YAML mapping), one line each."""
    snap = snapshot()
    errors: list[str] = []
    _Checker(snap).object(snap["root"], job, "", errors)
    return errors or _entity_errors(job)


def check_job(job: dict[str, Any], spec_fields: Mapping[str, str]) -> None:
    """Raise SpecError naming the spec field behind the first bad job field (``spec_fields``: job path -> spec
    field; the longest matching path wins)."""
    errors = job_errors(job)
    if errors:
        path = re.split(r": | key ", errors[0], maxsplit=1)[0]
        parts = path.split(".")
        prefixes = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
        field = next((spec_fields[p] for p in prefixes if p in spec_fields), "providers.azure")
        raise SpecError("Azure ML would reject the command job:\n    " + "\n    ".join(errors), field=field,
                        remedy=f"change {field} (it becomes the job's {path}; Azure ML's command job reference: "
                               "https://aka.ms/ml-cli-v2-job-command-yaml-reference)")
