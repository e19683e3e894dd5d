"""Tags (labels) as each platform accepts them: one spec's ``tags:`` may hold what one cloud allows and another
refuses. Characters a platform refuses become '_' and over-long parts are cut; every change is reported, so a plan
says what it did instead of a submit failing minutes later."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from cloudtrain.errors import SpecError

# SageMaker tags: keys 1-128, values 0-256 characters of Unicode letters, digits, separators (not tabs or newlines)
# and _.:/=+-@ ; the prefix 'aws:' is reserved.
_AWS_EXTRA = set("_.:/=+-@")


def _aws_clean(text: str) -> str:
    return "".join(ch if ch in _AWS_EXTRA or unicodedata.category(ch)[0] in "LNZ" else "_" for ch in text)
# Vertex labels: lowercase letters, digits, '_' and '-'; keys start with a letter; both at most 63 characters.
_GCP_BAD = re.compile(r"[^a-z0-9_-]")


def _aws(key: str, value: str) -> tuple[str, str]:
    if key.lower().startswith("aws:"):
        raise SpecError(f"tag {key!r} uses the prefix 'aws:', which AWS reserves", field=f"tags.{key}",
                        remedy="choose another key")
    return _aws_clean(key)[:128] or "_", _aws_clean(value)[:256]


def _gcp(key: str, value: str) -> tuple[str, str]:
    key = _GCP_BAD.sub("_", key.lower())
    if not key[:1].isalpha():
        key = "t" + key
    return key[:63], _GCP_BAD.sub("_", value.lower())[:63]


RULES: dict[str, Callable[[str, str], tuple[str, str]]] = {"aws": _aws, "gcp": _gcp}


def platform_tags(provider: str, tags: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The tags as ``provider`` accepts them, and a note for each one that had to change."""
    rule = RULES[provider]
    out: dict[str, str] = {}
    notes: list[str] = []
    for key, value in tags.items():
        new_key, new_value = rule(key, value)
        if new_key in out:
            raise SpecError(f"tags {key!r} and another tag both become {new_key!r} on {provider}",
                            field=f"tags.{key}", remedy="rename one of them")
        if (new_key, new_value) != (key, value):
            notes.append(f"{provider}: tag {key}={value!r} sent as {new_key}={new_value!r} (platform rules)")
        out[new_key] = new_value
    return out, notes
