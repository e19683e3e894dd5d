"""What a job chain's recovery state may hold, as files keep it: in the home (``recovery/<root>.json``) and in the
checkpoint store beside the checkpoints (``_cloudtrain/lineage.json``), which every watcher of the team reads.

Two rules. A state read back is checked field by field before use (another version wrote it, a hand edited it, it
is not cloudtrain's at all): what is wrong is named with the file and the fix, never a traceback. And no secret
value is kept: the spec a later leg of a fallback list plans from is kept masked (``keep``), each secret with the
name of the environment variable it is taken from when that leg is submitted (``fill``): the submitting process's
own values, else the environment of the watcher that moves the job. docs/secrets.md.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any

from cloudtrain import contract
from cloudtrain.checkpoint.lineage import Unreadable, is_number
from cloudtrain.errors import UserError
from cloudtrain.handles import JobHandle
from cloudtrain.node import secret_values as sv
from cloudtrain.node.secret_values import MASK, mask_text, secret_name

_ARG_FIELDS = ("args", "resume_args", "requirements")  # split_args' order: CLOUDTRAIN_SECRET_ARG_<n> numbers them
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_held: dict[str, dict[str, str]] = {}  # chain root -> the values this process submitted it with (a foreground
# submit that moves its own job later takes them from here, not from a file)


# -- secrets --------------------------------------------------------------------------------------------------------


def keep(spec: dict[str, Any], environ: Mapping[str, str] | None = None
         ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """``spec`` with every secret value masked; where each comes back from: ``[{"at": [field, key or index],
    "offset": n, "variable": NAME}]`` (the value replaces the string's part from ``offset`` on); and the values, by
    variable (for ``hold``). An ``env`` entry comes back from the variable of its name; a secret argument from a
    variable of the submitting environment that holds it (``--password $APP_PASSWORD``), else from
    ``CLOUDTRAIN_SECRET_ARG_<n>``, the name the job's own nodes get it under."""
    environ = os.environ if environ is None else environ
    kept, refs, values = copy.deepcopy(spec), [], {}
    env = {k: v for k, v in (spec.get("env") or {}).items() if isinstance(k, str) and isinstance(v, str)}
    known = sv.known_secrets(spec)

    def source(value: str, fallback: str) -> str:
        return next((name for name, held in [*env.items(), *sorted(environ.items())]
                     if held == value and _VARIABLE.match(name)), fallback)

    def add(at: list[Any], offset: int, variable: str, real: str) -> None:
        refs.append({"at": at, "offset": offset, "variable": variable})
        values[variable] = real[offset:]

    for name, value in env.items():
        shown = MASK if secret_name(name) else mask_text(value, known)
        if shown != value:
            kept["env"][name] = shown
            add(["env", name], 0, name, value)
    fields = [(f, i) for f in _ARG_FIELDS if isinstance(spec.get(f), list)
              for i, item in enumerate(spec[f]) if isinstance(item, str)]
    bearing = [spec[f][i] for f, i in fields]
    for n, (index, (offset, by_flag)) in enumerate(sorted(sv.secret_arg_parts(bearing, sv.env_secrets(env)).items())):
        f, i = fields[index]
        part = bearing[index][offset:]
        shown = mask_text(part, known)
        kept[f][i] = bearing[index][:offset] + (MASK if by_flag or shown == part else shown)
        add([f, i], offset, source(part, f"{sv.ARG_ENV_PREFIX}{n}"), bearing[index])

    def visit(node: Any, key: Any, at: list[Any]) -> None:  # the rest: a URL with a password in inputs ...
        value = node[key]
        if isinstance(value, str):
            shown = MASK if isinstance(key, str) and secret_name(key) else mask_text(value, known)
            if shown != value:
                node[key] = shown
                add([*at, key], 0, source(value, _variable_for([*at, key])), value)
        for inner in (list(value) if isinstance(value, dict) else range(len(value)) if isinstance(value, list)
                      else ()):
            visit(value, inner, [*at, key])

    for name in [name for name in kept if name not in ("env", *_ARG_FIELDS)]:
        visit(kept, name, [])
    return kept, refs, values


def hold(root: str, values: dict[str, str]) -> None:
    """Keep the secret values of the chain rooted at ``root`` in this process's memory, for a later leg it submits."""
    _held[root] = dict(values)


def _variable_for(at: list[Any]) -> str:
    return contract.SECRET_FIELD_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", "_".join(map(str, at))).strip("_").upper()


def where(ref: dict[str, Any]) -> str:
    """A reference's field as a person reads it: ``env.HF_TOKEN``, ``args[3]``."""
    at = ref["at"]
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if n else p) for n, p in enumerate(at))


def needed(refs: list[dict[str, Any]]) -> str:
    """The variables a later leg needs, each with the field it fills: ``HF_TOKEN, APP_PASSWORD (args[1])``."""
    return ", ".join(dict.fromkeys(ref["variable"] + ("" if where(ref) == f"env.{ref['variable']}" else
                                                      f" ({where(ref)})") for ref in refs))


def fill(kept: dict[str, Any], refs: list[dict[str, Any]], root: str, what: str,
         environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The spec with its secret values back, each from this process: the values it submitted the chain ``root``
    with, else its environment. A variable that is not set is refused (exit 2) naming it and ``what`` needed it."""
    values = {**(os.environ if environ is None else environ), **_held.get(root, {})}
    missing = [ref for ref in refs if ref["variable"] not in values]
    if missing:
        raise UserError(f"{what} needs the job's secret values, which no file keeps; this process's environment "
                        f"lacks {needed(missing)}",
                        remedy="set each (the values the job was submitted with, e.g. `export "
                               f"{missing[0]['variable']}=...`) where this command runs, and run it again; "
                               "nothing was submitted")
    spec = copy.deepcopy(kept)
    for ref in refs:
        *path, last = ref["at"]
        node: Any = spec
        for part in path:
            node = node[part]
        node[last] = node[last][:ref["offset"]] + values[ref["variable"]]
    return spec


# -- checks ---------------------------------------------------------------------------------------------------------


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _handle(value: Any) -> bool:
    try:
        JobHandle.parse(value)
    except (UserError, TypeError, AttributeError):
        return False
    return True


def _ref_fits(ref: Any, spec: Any) -> bool:
    """A reference names a masked string of the kept spec (a file cannot send a value anywhere else)."""
    if not (isinstance(ref, dict) and isinstance(ref.get("at"), list) and ref["at"] and isinstance(spec, dict)
            and isinstance(ref.get("variable"), str) and _VARIABLE.match(ref["variable"])
            and _count(ref.get("offset"))):
        return False
    node: Any = spec
    for part in ref["at"]:
        inside = part in node if isinstance(node, dict) and isinstance(part, str) else \
            isinstance(node, list) and _count(part) and part < len(node)
        if not inside:
            return False
        node = node[part]
    return isinstance(node, str) and MASK in node[ref["offset"]:]


_CHECKS: dict[str, tuple[str, Any]] = {  # field: (what it must be, the test), for fields a state may leave out
    "root": ("a job handle", _handle),
    "max_restarts": ("a whole number of 0 or more", _count),
    "retry_failed": ("true or false", lambda v: isinstance(v, bool)),
    "chain": ("a list of job handles, the first submission first", lambda v: isinstance(v, list) and v
              and all(_handle(h) for h in v)),
    "max_recovery": ("seconds (a number of 0 or more) or null", lambda v: v is None or is_number(v, 0)),
    "recovering_since": ("a time (seconds since 1970) or null", lambda v: v is None or is_number(v)),
    "recovered_s": ("seconds (a number of 0 or more)", lambda v: is_number(v, 0)),
    "history": ("a list of objects of handle, provider, region, why", lambda v: isinstance(v, list) and all(
        isinstance(e, dict) and all(e.get(k) is None or isinstance(e[k], str) for k in
                                    ("handle", "provider", "region", "why")) for e in v)),
    "legs": ("a list of {provider, region}", lambda v: isinstance(v, list) and all(
        isinstance(e, dict) and isinstance(e.get("provider"), str)
        and (e.get("region") is None or isinstance(e["region"], str)) for e in v)),
    "leg": ("a whole number of 0 or more", _count),
    "spec": ("an object or null", lambda v: v is None or isinstance(v, dict)),
    "state_uri": ("a URI or null", lambda v: v is None or isinstance(v, str)),
    "secrets": ("a list of {at, offset, variable}", lambda v: isinstance(v, list)),
}


def check_state(data: Any, origin: str) -> dict[str, Any]:
    """``data`` if it is a chain's recovery state; else Unreadable, naming ``origin`` (the file), the field and
    what it must be. Fields a later version adds are left alone."""
    def wrong(what: str) -> Unreadable:
        return Unreadable(f"{origin} is not a job chain's recovery state cloudtrain can use: {what}",
                          remedy="delete it (a watcher started from the home that submitted the job writes it "
                                 "again), or put back the copy cloudtrain wrote")

    if not isinstance(data, dict):
        raise wrong(f"it holds {type(data).__name__ if data is not None else 'null'}, not an object")
    for name in ("root", "max_restarts", "chain"):
        if name not in data:
            raise wrong(f"{name} is missing")
    for name, (must, test) in _CHECKS.items():
        if name in data and not test(data[name]):
            raise wrong(f"{name} is {_shown(data[name])}; it must be {must}")
    legs = data.get("legs") or []
    if legs and data.get("leg", 0) >= len(legs):
        raise wrong(f"leg is {data['leg']}, but legs lists {len(legs)}")
    for ref in data.get("secrets") or []:
        if not _ref_fits(ref, data.get("spec")):
            raise wrong(f"secrets holds {_shown(ref)}, which names no masked value of its spec")
    return data


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
