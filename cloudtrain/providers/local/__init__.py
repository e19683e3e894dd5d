"""The local provider: each node is a real torchrun agent on this machine, started by the same bootstrap a cloud
node runs, from a bundle staged in a local object store. ``--emulate`` runs the nodes under another provider's node
contract instead of cloudtrain's own (node.py here).

This folder is the whole provider; ``PROVIDER`` says where each part is (see cloudtrain/registry.py)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="local", summary="torchrun processes with gloo on this machine", package=__name__,
    provider="provider:LocalProvider", title="this machine", extra="local", requires=("torch",),
    options="options:LocalOptions", plan_summary="provider:plan_summary", doctor="doctor:checks", node="node",
    platform="local", name_pattern=r"[a-z0-9][a-z0-9-]{0,62}",
    name_rule="lowercase letters, digits and '-', at most 63 (a folder and a process tag)",
)
