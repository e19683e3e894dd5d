"""Tags reach each platform in a form it accepts, whatever the spec holds; what changed is said in the plan."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.errors import SpecError
from cloudtrain.providers.aws.request import user_tags
from cloudtrain.providers.aws.validate import request_errors
from cloudtrain.providers.gcp.request import user_labels

keys = st.text(min_size=1, max_size=200).filter(lambda k: not k.lower().startswith("aws:"))
tag_dicts = st.dictionaries(keys, st.text(max_size=300), max_size=8)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(tag_dicts)
def test_any_tags_become_tags_sagemaker_accepts(tags: dict[str, str]) -> None:
    try:
        sent, notes = user_tags(tags)
    except SpecError as exc:  # two keys that collapse into one: refused, naming the field
        assert exc.field and exc.field.startswith("tags.")
        return
    request = {"Tags": [{"Key": k, "Value": v} for k, v in sent.items()]}
    # botocore's own model is the judge (pattern, lengths); other members are absent on purpose
    assert [e for e in request_errors("sagemaker", "CreateTrainingJob", request) if "Tags" in e] == []
    assert len(notes) == sum(1 for k, v in tags.items() if (k, v) not in sent.items())


@settings(max_examples=150, deadline=None)
@given(tag_dicts)
def test_any_tags_become_valid_vertex_labels(tags: dict[str, str]) -> None:
    try:
        sent, _ = user_labels(tags)
    except SpecError:
        return
    for key, value in sent.items():
        assert re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key) and re.fullmatch(r"[a-z0-9_-]{0,63}", value)


def test_valid_tags_pass_unchanged_and_reserved_ones_are_refused() -> None:
    assert user_tags({"team": "vision", "cost-center": "ml/42"}) == (
        {"team": "vision", "cost-center": "ml/42"}, [])
    sent, notes = user_tags({"owner": "ana<ops>"})
    assert sent == {"owner": "ana_ops_"} and "owner='ana<ops>' sent as owner='ana_ops_'" in notes[0]
    with pytest.raises(SpecError, match="reserves"):
        user_tags({"aws:cloudformation": "x"})
    assert user_labels({"Team": "Vision"})[0] == {"team": "vision"}
