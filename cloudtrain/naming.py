"""Job names and tags (labels) as each platform accepts them.

A job name is checked against the provider's declared ``name_pattern`` (registry.Declaration) when it is planned or
resubmitted, so a name the platform would refuse is a spec error naming the rule, not a failed submit.

Tags (labels) as each platform accepts them: one spec's ``tags:`` may hold what one cloud allows and another
refuses. Characters a platform refuses become '_' and over-long parts are cut; every change is reported, so a plan
says what it did instead of a submit failing minutes later. The rule (which characters, how long) is each provider's,
in its request.py; applying it and reporting changes is done here, once."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from cloudtrain.errors import SpecError

Rule = Callable[[str, str], tuple[str, str]]  # (key, value) -> (key, value) as the platform accepts them
# What makes a job id unique (staging.new_job_id: <name>-<UTC date>-<time>-<4 hex>), and a restart's -rN after it
_STAMP = r"-\d{8}-\d{6}-[0-9a-f]{4}"
_UNIQUE_TAIL = re.compile(rf"({_STAMP})?(-r\d+)?$")


def shortened(name: str, limit: int) -> str:
    """``name`` in at most ``limit`` characters with what makes it unique kept: the head (the spec's name) gives
    way, never the date, time and random part of the job id or a restart's -rN, so two jobs of one long name
    submitted seconds apart keep two names. A name without that stamp keeps a digest of its head instead."""
    if len(name) <= limit:
        return name
    found = _UNIQUE_TAIL.search(name)
    assert found is not None  # the pattern matches at the end of any name, if only the empty tail
    head, stamp, restart = name[:found.start()], found.group(1), found.group(2) or ""
    tail = (stamp or "-" + hashlib.sha256(head.encode()).hexdigest()[:8]) + restart
    return head[:max(1, limit - len(tail))].rstrip("-") + tail


def platform_tags(provider: str, tags: dict[str, str], rule: Rule) -> tuple[dict[str, str], list[str]]:
    """The tags as ``provider`` accepts them (``rule``), and a note for each one that had to change."""
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


def check_job_name(provider: str, name: str, pattern: str | None, rule: str = "") -> None:
    """Refuse a job name the platform would refuse (``pattern``: the provider's ``Declaration.name_pattern``)."""
    if pattern is None or re.fullmatch(pattern, name):
        return
    raise SpecError(f"job name {name!r} breaks {provider}'s rule for job names: {rule or pattern}", field="name",
                    remedy="choose a shorter name of lowercase letters, digits and '-' (--name)")
