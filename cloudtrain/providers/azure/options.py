"""``providers.azure`` in a job spec (and in a profile): the Azure ML workspace, compute and environment."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from cloudtrain.spec.fields import Settings


class AzureOptions(Settings):
    unicode_fields: ClassVar[frozenset[str]] = frozenset({"resource_group"})  # Azure allows Unicode letters there

    subscription_id: str | None = None
    resource_group: str | None = None
    workspace: str | None = None
    compute: str | None = Field(None, description="Compute cluster name; omit for serverless compute")
    instance_type: str | None = Field(None, description="VM size for serverless compute, e.g. Standard_NC24ads_A100_v4")
    experiment: str | None = None
    environment: str | None = Field(None, description="Azure ML environment (name@version) overriding the image")
