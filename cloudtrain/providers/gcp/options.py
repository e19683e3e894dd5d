"""``providers.gcp`` in a job spec (and in a profile): the Google Cloud project, region, bucket and machines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from cloudtrain.spec.fields import Duration, Settings, shaped
from cloudtrain.storage.uris import check_bucket

_REGION = shaped(r"[a-z]+-[a-z]+[0-9]{1,2}", "a Google Cloud region", "us-central1")


class GcpOptions(Settings):
    project: str | None = None
    region: str | None = None
    # us-central1, europe-west4, northamerica-northeast1 (a zone such as us-central1-a is not a Vertex location)
    _region = field_validator("region")(_REGION)
    regions: list[str] = Field(default_factory=list, description="With a fallback list (provider: [gcp, ...]): "
                               "the regions to try, in order (each its own leg)")
    _regions = field_validator("regions")(lambda value: [_REGION(r) for r in value])
    bucket: str | None = Field(None, description="GCS bucket for staging the source bundle")
    _bucket = field_validator("bucket")(lambda value: check_bucket("gs", value))
    machine_type: str | None = None
    accelerator_type: str | None = None
    service_account: str | None = None
    network: str | None = None
    capacity: Literal["spot", "flex_start"] | None = Field(
        None, description="Vertex scheduling strategy: 'spot' (as spot: true), or 'flex_start' (queued until the "
                          "whole capacity is free, for up to flex_start_max_wait)")
    flex_start_max_wait: Duration | None = Field(None, description="With capacity: flex_start; default: no limit")
