"""A job spec's validation errors in the user's words: each field named as in YAML, its fix, "did you mean" for a
mistyped key (a plugin's fields and names too), and text no platform accepts refused before validation."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from cloudtrain import registry
from cloudtrain.errors import SpecError


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1] if parts else ''}[{item}]"]
        elif item in {"function-before[parse_duration(), int]", "constrained-int", "literal['auto']", "int", "str"}:
            continue  # pydantic's union/validator branch names mean nothing to a user
        else:
            parts.append(str(item))
    return ".".join(parts) or "spec"


def _known_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at the parent of ``loc`` (for 'did you mean' hints): the model that refused it, plugins'
    options included; under ``providers`` every registered provider's name."""
    if tuple(loc[:-1]) == ("providers",):
        return registry.names()
    current: Any = model
    for item in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(item)
        if field is None:
            return []
        current = field.annotation
    return list(getattr(current, "model_fields", {}))


def friendly_error(err: Any) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx['pattern']}"
    return str(err["msg"]).removeprefix("Value error, ")


def _short(value: Any) -> str:
    """A value as the error echoes it: a 4,000-character folder name is shown by its start and its length."""
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:80]}... ({len(str(value))} characters)"


def spec_error_from(exc: ValidationError, source: str | None, model: type[BaseModel]) -> SpecError:
    """Turn pydantic's errors (from validating ``model``) into one message that names each field and its fix."""
    from cloudtrain.node.secret_values import looks_secret

    lines: list[str] = []
    remedies: list[str] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _location(loc)
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            close = difflib.get_close_matches(key, _known_fields(model, loc), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            lines.append(f"{where}: unknown key{hint}")
            remedies.append(f"remove or rename '{key}'")
        else:
            msg = friendly_error(err)
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) or got is None or looks_secret(where, str(got)) \
                else f" (got {_short(got)})"  # a password given as a number is not echoed
            lines.append(f"{where}: {msg}{shown}" if where != "spec" else f"{msg}")
            if where != "spec":
                remedies.append(f"set {where} to a valid value")
    prefix = f"invalid job spec in {source}:\n  " if source else "invalid job spec:\n  "
    remedy = "; ".join(dict.fromkeys(remedies)) or "correct the spec as described above"
    remedy += " (`cloudtrain schema` lists every field)"
    return SpecError(prefix + "\n  ".join(lines), remedy=remedy)


def unusable_text(data: Any, where: str = "") -> tuple[str, str] | None:
    """The first key or value holding text no operating system or platform accepts (a NUL byte, half a UTF-16
    surrogate pair), as (where, what); None when all is well."""
    if isinstance(data, str):
        if "\0" in data:
            return where or "spec", "holds a NUL byte (\\0)"
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            return where or "spec", "holds text that is not valid Unicode (a lone surrogate)"
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        inner = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        found = unusable_text(key, inner) if isinstance(key, str) else None
        if found:
            return found[0].encode("unicode_escape").decode(), "is a key that " + found[1]
        found = unusable_text(value, inner)
        if found:
            return found
    return None
