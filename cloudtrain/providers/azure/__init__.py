"""Azure Machine Learning command jobs. azure-ai-ml is imported inside calls only (about 1.5 s).

This folder is the whole provider; ``PROVIDER`` says where each part is (see cloudtrain/registry.py)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="azure", summary="Azure Machine Learning command jobs", package=__name__,
    provider="provider:AzureMLProvider", title="Azure ML", extra="azure", requires=("azure.ai.ml",),
    options="options:AzureOptions", settings="settings:platform_setting", plan_summary="provider:plan_summary",
    cloud_vm="doctor:on_this_cloud", doctor="doctor:checks", node="node",
    platform="azureml", catalog="catalog.json", instance_option="providers.azure.instance_type",
    images="images.json", torch_minors="images:offered_minors", export="export",
    name_pattern=r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,254}", name_rule="a job name: letters, digits, '-' and '_', at most 255",
    handle_scope=("subscription", "resource_group", "workspace"),
)
