"""``providers.aws`` in a job spec (and in a profile): where SageMaker runs the job and what it may touch."""

from __future__ import annotations

from pydantic import Field, field_validator

from cloudtrain.spec.fields import Settings, shaped
from cloudtrain.storage.uris import check_bucket

_REGION = shaped(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]{1,2}", "an AWS region", "us-east-1")


class AwsOptions(Settings):
    region: str | None = None
    # us-east-1, us-gov-west-1, cn-north-1, eu-isoe-west-1: caught here rather than as an endpoint that never answers
    _region = field_validator("region")(_REGION)
    role: str | None = Field(None, description="IAM role ARN SageMaker assumes for the job")
    bucket: str | None = Field(None, description="S3 bucket for staging the source bundle")
    _bucket = field_validator("bucket")(lambda value: check_bucket("s3", value))
    instance_type: str | None = Field(None, pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    volume_size_gb: int = Field(30, ge=1, le=16384)
    subnets: list[str] = Field(default_factory=list)
    security_group_ids: list[str] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list, description="With a fallback list (provider: [aws, ...]): "
                               "the regions to try, in order (each its own leg)")
    _regions = field_validator("regions")(lambda value: [_REGION(r) for r in value])
