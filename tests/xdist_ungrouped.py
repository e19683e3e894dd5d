"""A grouped test whose group pytest-xdist's worker does not get into its node id (as with pytest 9.2, which no
longer reads the ``item._nodeid`` xdist writes), for tests/test_suite_guards.py: run on its own as a plugin and a test
file (``pytest -p tests.xdist_ungrouped -n 1 --dist loadgroup tests/xdist_ungrouped.py``; never collected with the
suite: its name is not test_*), the run must stop at collection, before the test runs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("ungrouped")


@pytest.hookimpl(trylast=True)  # after xdist's worker wrote the group into the ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item._nodeid = item._nodeid.partition("@")[0]


def test_never_runs() -> None:
    raise AssertionError("a grouped test whose id lost its group ran")
