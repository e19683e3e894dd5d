"""Amazon SageMaker training jobs. Everything heavy (boto3, botocore's service model) is imported inside calls.

This folder is the whole provider; ``PROVIDER`` says where each part is (see cloudtrain/registry.py)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="aws", summary="Amazon SageMaker training jobs", package=__name__, provider="provider:SageMakerProvider",
    title="SageMaker", extra="aws", requires=("boto3",), options="options:AwsOptions",
    env={"region": ("AWS_REGION", "AWS_DEFAULT_REGION"), "role": ("CLOUDTRAIN_AWS_ROLE",),
         "bucket": ("CLOUDTRAIN_AWS_BUCKET",)},
    settings="settings:platform_setting",
    placeholders={"role": "arn:aws:iam::000000000000:role/SET-providers.aws.role",
                  "bucket": "set-providers-aws-bucket"},
    plan_summary="provider:plan_summary", cloud_vm="doctor:on_this_cloud",
    doctor="doctor:checks", node="node", platform="sagemaker", catalog="catalog.json",
    instance_option="providers.aws.instance_type", torch_minors="images:offered_minors", export="export",
    name_pattern=r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name_rule="TrainingJobName: letters, digits and '-', at most 63",
    handle_scope=("region",),
)
