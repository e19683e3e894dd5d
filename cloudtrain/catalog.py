"""Which machine each provider uses for a spec's ``accelerator`` ("A100:8"): one table per provider, no SDK needed.

A spec names GPUs (model and count per node), the way users think of them; each platform sells them as instance
types. ``providers.<name>.instance_type`` (or machine type) always wins over this table.
"""

from __future__ import annotations

from cloudtrain.errors import SpecError

# (GPU model, GPUs per node) -> SageMaker training instance type.
AWS: dict[tuple[str, int], str] = {
    ("T4", 1): "ml.g4dn.xlarge", ("T4", 4): "ml.g4dn.12xlarge", ("T4", 8): "ml.g4dn.metal",
    ("A10G", 1): "ml.g5.xlarge", ("A10G", 4): "ml.g5.12xlarge", ("A10G", 8): "ml.g5.48xlarge",
    ("L4", 1): "ml.g6.xlarge", ("L4", 4): "ml.g6.12xlarge", ("L4", 8): "ml.g6.48xlarge",
    ("L40S", 1): "ml.g6e.xlarge", ("L40S", 4): "ml.g6e.12xlarge", ("L40S", 8): "ml.g6e.48xlarge",
    ("V100", 1): "ml.p3.2xlarge", ("V100", 4): "ml.p3.8xlarge", ("V100", 8): "ml.p3.16xlarge",
    ("A100", 8): "ml.p4d.24xlarge", ("A100-80GB", 8): "ml.p4de.24xlarge",
    ("H100", 8): "ml.p5.48xlarge", ("H200", 8): "ml.p5e.48xlarge",
}
AWS_CPU_DEFAULT = "ml.m5.xlarge"

# (GPU model, GPUs per node) -> Azure VM size (serverless compute; a named cluster has its own size).
AZURE: dict[tuple[str, int], str] = {
    ("T4", 1): "Standard_NC4as_T4_v3", ("T4", 4): "Standard_NC64as_T4_v3",
    ("V100", 1): "Standard_NC6s_v3", ("V100", 2): "Standard_NC12s_v3", ("V100", 4): "Standard_NC24s_v3",
    ("V100", 8): "Standard_ND40rs_v2",
    ("A100", 1): "Standard_NC24ads_A100_v4", ("A100", 2): "Standard_NC48ads_A100_v4",
    ("A100", 4): "Standard_NC96ads_A100_v4", ("A100", 8): "Standard_ND96asr_v4",
    ("A100-80GB", 8): "Standard_ND96amsr_A100_v4", ("H100", 8): "Standard_ND96isr_H100_v5",
}
AZURE_CPU_DEFAULT = "Standard_DS3_v2"

TABLES: dict[str, dict[tuple[str, int], str]] = {"aws": AWS, "azure": AZURE}
CPU_DEFAULTS = {"aws": AWS_CPU_DEFAULT, "azure": AZURE_CPU_DEFAULT}


def gpus_of(provider: str, instance_type: str) -> int | None:
    """GPUs per node of a machine in the table (None: not in it, e.g. a CPU instance or an explicit exotic type)."""
    return next((count for (_, count), name in TABLES[provider].items() if name == instance_type), None)


def instance_for(provider: str, model: str | None, count: int, explicit: str | None, field: str) -> str:
    """The instance type for ``count`` x ``model`` GPUs per node (``explicit`` wins; no GPU: a CPU default)."""
    if explicit:
        return explicit
    if model is None:
        return CPU_DEFAULTS[provider]
    table = TABLES[provider]
    found = table.get((model, count))
    if found:
        return found
    offered = sorted(c for m, c in table if m == model)
    if offered:
        hint = f"{model} comes {', '.join(f'{model}:{c}' for c in offered)} per node on {provider}"
    else:
        models = sorted({m for m, _ in table})
        hint = f"known GPU models on {provider}: {', '.join(models)}"
    raise SpecError(f"no {provider} machine with {count} x {model} ({hint})",
                    field="accelerator", remedy=f"pick one of those, or set {field} explicitly")
