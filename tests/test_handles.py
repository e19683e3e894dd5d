from __future__ import annotations

import pytest

from cloudtrain.errors import HandleError
from cloudtrain.handles import JobHandle


@pytest.mark.parametrize(
    ("text", "provider", "scope", "job_id"),
    [
        ("local://train-20260101-000000-ab12", "local", (), "train-20260101-000000-ab12"),
        ("aws://us-east-1/my-job", "aws", ("us-east-1",), "my-job"),
        ("gcp://proj/us-central1/123", "gcp", ("proj", "us-central1"), "123"),
    ],
)
def test_round_trip(text: str, provider: str, scope: tuple, job_id: str) -> None:
    handle = JobHandle.parse(text)
    assert (handle.provider, handle.scope, handle.job_id) == (provider, scope, job_id)
    assert str(handle) == text


@pytest.mark.parametrize("text", ["", "local", "local://", "://x", "Local://x", "local://a/../b", "local://a b"])
def test_bad_handles(text: str) -> None:
    with pytest.raises(HandleError) as info:
        JobHandle.parse(text)
    assert info.value.exit_code == 2 and "fix:" in info.value.render()
