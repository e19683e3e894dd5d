"""Google Vertex AI custom jobs. Everything heavy (google-cloud-aiplatform, google-auth) is imported inside calls.

This folder is the whole provider; ``PROVIDER`` says where each part is (see cloudtrain/registry.py)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="gcp", summary="Google Vertex AI custom jobs", package=__name__, provider="provider:VertexProvider",
    title="Vertex", extra="gcp", requires=("google.cloud.aiplatform_v1",), options="options:GcpOptions",
    env={"project": ("CLOUDTRAIN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"),
         "region": ("CLOUDTRAIN_GCP_REGION", "CLOUDSDK_AI_REGION", "CLOUDSDK_COMPUTE_REGION"),
         "bucket": ("CLOUDTRAIN_GCP_BUCKET",)},
    settings="settings:platform_setting",
    placeholders={"project": "set-providers-gcp-project", "bucket": "set-providers-gcp-bucket"},
    plan_summary="provider:plan_summary", cloud_vm="doctor:on_this_cloud",
    doctor="doctor:checks", node="node", platform="vertex", catalog="catalog.json",
    instance_option="providers.gcp.machine_type", images="images.json", torch_minors="images:offered_minors",
    export="export",
    name_pattern=r"[a-z0-9][a-z0-9_-]{0,62}",
    name_rule="a label value (cloudtrain finds its jobs by it): lowercase letters, digits, '-' and '_', at most 63",
    handle_scope=("project", "region"),
)
