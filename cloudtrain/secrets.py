"""Secret-looking values never reach a plan printout, a log line or a job record on disk."""

from __future__ import annotations

import re
from typing import Any

MASK = "****"
_SECRET_NAME = re.compile(
    r"(^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|CREDENTIALS?|AUTH|PRIVATE|SAS|SIGNATURE|COOKIE|SESSION)(_|$)"
    r"|API_?KEY|ACCESS_?KEY|CONNECTION_?STRING|HF_TOKEN|WANDB_API_KEY",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"^(AKIA|ASIA)[A-Z0-9]{16}$"  # AWS access key id
    r"|^(ghp|gho|ghs|github_pat|hf|sk|xox[abp])[_-][A-Za-z0-9_-]{16,}$"  # common token prefixes
    r"|AccountKey=|SharedAccessSignature=|sig=[A-Za-z0-9%]{20,}"
)


def looks_secret(name: str, value: object = "") -> bool:
    return bool(_SECRET_NAME.search(name)) or (isinstance(value, str) and bool(_SECRET_VALUE.search(value)))


def _name_value(data: dict[Any, Any]) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """AWS tags/env entries ({"Key", "Value"}), Vertex env ({"name", "value"}) ..."""
    if len(data) != 2:
        return None
    for name_key, value_key in (("Key", "Value"), ("Name", "Value"), ("key", "value"), ("name", "value")):
        name, value = data.get(name_key), data.get(value_key)
        if isinstance(name, str) and isinstance(value, str):
            return (name_key, name), (value_key, value)
    return None


def redact(data: Any) -> Any:
    """A deep copy of ``data`` with every secret-looking mapping value replaced by ****."""
    if isinstance(data, dict):
        pair = _name_value(data)
        if pair is not None:  # a request's {"Key"|"Name": n, "Value": v} entry: judge v by n, keep n readable
            (name_key, name), (value_key, value) = pair
            return {name_key: name, value_key: MASK if looks_secret(name, value) else value}
        return {k: MASK if isinstance(k, str) and isinstance(v, str) and looks_secret(k, v) else redact(v)
                for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data
