"""The plan: its model, the planner and what it assembles, saved and sealed plans, the submitter, export, compare,
cost, interval.

Loading this room installs the submitter into the provider interface (``Provider.submit`` runs it): every plan comes
from here, and the interface below names no room above it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain.providers.base import Provider

if TYPE_CHECKING:
    from cloudtrain.handles import JobHandle
    from cloudtrain.providers.translation import Planned


def _submit(provider: Provider, plan: Planned) -> JobHandle:
    from cloudtrain.plan.submitter import submit

    return submit(provider, plan)


Provider.around_submit = _submit
