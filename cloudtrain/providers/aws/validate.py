"""Check a request offline against botocore's own service model, before anything is sent.

botocore's ParamValidator checks types, required members and minimums; the model also declares maximums, patterns
and enums that only the service enforces (a typo'd instance type fails minutes later, server-side). Both are
checked here, so a plan that validates is one SageMaker accepts in shape.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import cache
from typing import Any

from cloudtrain.errors import UserError


def botocore_stamp() -> str:
    """What botocore's data files depend on, read without importing botocore: its install (folder and the stamp of
    its ``__init__``), the user's own models (~/.aws/models) and AWS_DATA_PATH. Keys `home.derived` caches."""
    import importlib.util
    import os

    found = importlib.util.find_spec("botocore")
    parts = [os.environ.get("AWS_DATA_PATH", "")]
    for path in ([found.origin] if found and found.origin else []) + [os.path.expanduser("~/.aws/models")]:
        try:
            st = os.stat(path)
        except OSError:
            parts.append(f"{path}:-")
        else:
            parts.append(f"{path}:{st.st_mtime_ns}:{st.st_size}")
    return "|".join(parts)


def _reachable(shapes: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    """The shapes ``roots`` name, and every shape they name in turn."""
    found: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found or name not in shapes:
            continue
        shape = found[name] = shapes[name]
        refs = [*shape.get("members", {}).values(), *(shape[k] for k in ("member", "key", "value") if k in shape)]
        todo += [ref["shape"] for ref in refs if isinstance(ref, dict) and "shape" in ref]
    return found


def _operation_slice(service: str, operation: str) -> dict[str, Any]:
    """The part of botocore's service model one operation needs (the whole SageMaker model is ~4 MB of JSON)."""
    from botocore.loaders import create_loader

    model = create_loader().load_service_model(service, "service-2")
    op = model["operations"][operation]
    roots = [op[k]["shape"] for k in ("input", "output") if k in op]
    return {"metadata": model["metadata"], "operations": {operation: op},
            "shapes": _reachable(model["shapes"], roots)}


@cache
def _operation(service: str, operation: str) -> Any:
    """botocore's model of one operation, built from the cached slice of its service model: the same shapes botocore
    validates with, without parsing the whole service (cloudtrain.home.paths.derived, keyed on botocore's install)."""
    from botocore.model import ServiceModel

    from cloudtrain.home.paths import derived

    return derived(f"botocore-{service}-{operation}", botocore_stamp(), lambda: _operation_slice(service, operation),
                   lambda data: ServiceModel(data, service_name=service).operation_model(operation))


_UNICODE_CLASS = re.compile(r"^\^?\(?\[((?:\\p\{[A-Z]\}|[^\]])*)\]\*\)?\$?$")


@cache
def _matcher(pattern: str) -> Callable[[str], bool]:
    """A full-match test for an AWS (Java) pattern. Python's re has no \\p{L}-style classes, so the one shape AWS
    uses them in, ``[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*``, is checked by Unicode category, character by character."""
    shape = _UNICODE_CLASS.match(pattern)
    if shape and r"\p{" in pattern:
        body = shape.group(1)
        categories = tuple(re.findall(r"\\p\{([A-Z])\}", body))
        others = set(re.sub(r"\\p\{[A-Z]\}", "", body).replace("\\", ""))
        return lambda value: all(ch in others or unicodedata.category(ch)[0] in categories for ch in value)
    # elsewhere an approximation: letters/digits as \w, separators as \s
    compiled = re.compile(pattern.replace(r"\p{L}", r"\w").replace(r"\p{N}", r"\w").replace(r"\p{Z}", r"\s"))
    return lambda value: compiled.fullmatch(value) is not None


def _walk(shape: Any, value: Any, path: str, errors: list[str]) -> None:
    meta, kind = shape.metadata, shape.type_name
    sized = len(value) if isinstance(value, (str, list, dict)) else value if isinstance(value, int) else None
    if sized is not None and not isinstance(value, bool):
        if "min" in meta and sized < meta["min"]:
            errors.append(f"{path}: {value!r} is below the minimum {meta['min']}")
        if "max" in meta and sized > meta["max"]:
            what = "items" if isinstance(value, (list, dict)) else "characters" if isinstance(value, str) else ""
            errors.append(f"{path}: {sized} {what} exceeds the maximum {meta['max']}".replace("  ", " "))
    if kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            errors.append(f"{path}: {value!r} is not one of the {len(shape.enum)} values the service accepts")
        elif "pattern" in meta and not _matcher(meta["pattern"])(value):
            errors.append(f"{path}: {value!r} does not match {meta['pattern']}")
    elif kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _walk(shape.members[name], member, f"{path}.{name}" if path else name, errors)
    elif kind == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            _walk(shape.member, item, f"{path}[{i}]", errors)
    elif kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            _walk(shape.key, key, f"{path} key {key!r}", errors)
            _walk(shape.value, item, f"{path}[{key!r}]", errors)


def request_errors(service: str, operation: str, params: dict[str, Any]) -> list[str]:
    """Every problem botocore's model finds with ``params``, one line each (empty: valid)."""
    from botocore.validate import ParamValidator

    shape = _operation(service, operation).input_shape
    report = ParamValidator().validate(params, shape)
    errors = [line.strip() for line in report.generate_report().splitlines()[1:] if line.strip()] \
        if report.has_errors() else []
    _walk(shape, params, "", errors)
    return errors


def check_request(service: str, operation: str, params: dict[str, Any]) -> None:
    errors = request_errors(service, operation, params)
    if errors:
        raise UserError(f"the {operation} request would be rejected:\n    " + "\n    ".join(errors),
                        remedy="fix the spec fields behind those request fields (see `cloudtrain plan -o json`)")
