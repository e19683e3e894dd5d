"""``providers.local`` in a job spec: where a local job stages its bundle, how it stops, and which platform's node
contract its nodes run under (``--emulate``: any provider's, plugins' included)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from cloudtrain.spec.fields import Duration, Model, Uri, Usd


def _platforms(schema: dict[str, Any]) -> None:
    """The JSON Schema's choices for ``emulate``: every node contract the registry knows, read when a schema is
    made (so a plugin's shows up)."""
    from cloudtrain import registry

    choices = [d.platform_name for d in registry.declarations().values() if d.node and d.name != "local"]
    schema["anyOf"] = [{"enum": choices, "type": "string"}, {"type": "null"}]


class LocalOptions(Model):
    store_uri: Uri | None = Field(
        None, description="Object store for staged bundles (default: file:// under the cloudtrain home)")
    grace_period: Duration = Field(30, description="Seconds between SIGTERM and SIGKILL on cancel")
    price_per_node_hour: Usd | None = Field(
        None, description="What a node-hour of this machine costs you, USD: a local job's price, so max_cost and "
                          "`cloudtrain cost` can be rehearsed here (no one-hour floor: a rehearsal stops in seconds)")
    emulate: str | None = Field(
        None, description="Run each node under that platform's node contract (files and variables)",
        json_schema_extra=_platforms)

    @field_validator("emulate")
    @classmethod
    def _known_platform(cls, value: str | None) -> str | None:
        from cloudtrain import registry

        if value is None:
            return value
        found = registry.by_platform(value)
        if found is None or not found.node or found.name == "local":
            known = [d.platform_name for d in registry.declarations().values() if d.node and d.name != "local"]
            raise ValueError(f"{value!r} is not a node contract; one of: {', '.join(known)}")
        return found.platform_name
