"""Kubernetes: a job is one Kubeflow Trainer v2 ``TrainJob`` (or a Training Operator v1 ``PyTorchJob``) whose nodes
run cloudtrain's bootstrap from a bundle staged in object storage or on a shared claim, created through the cluster's
REST API with the official ``kubernetes`` client (imported only by submit and what follows it).

This folder is the whole provider; ``PROVIDER`` says where each part is (see cloudtrain/registry.py)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="kubernetes", summary="Kubernetes with Kubeflow Trainer (TrainJob) or Training Operator (PyTorchJob)",
    package=__name__, provider="provider:KubernetesProvider", title="Kubernetes", extra="kubernetes",
    requires=("kubernetes",), options="options:KubernetesOptions",
    env={"staging": ("CLOUDTRAIN_KUBERNETES_STAGING",), "namespace": ("CLOUDTRAIN_KUBERNETES_NAMESPACE",),
         "context": ("CLOUDTRAIN_KUBERNETES_CONTEXT",), "queue": ("CLOUDTRAIN_KUBERNETES_QUEUE",),
         "image": ("CLOUDTRAIN_KUBERNETES_IMAGE",), "runtime": ("CLOUDTRAIN_KUBERNETES_RUNTIME",),
         "api": ("CLOUDTRAIN_KUBERNETES_API",)},
    settings="settings:platform_setting",
    placeholders={"staging": "pvc://set-providers-kubernetes-staging"},
    doctor="doctor:checks", node="node", platform="kubernetes", export="export", plan_summary="provider:plan_summary",
    # RFC 1035 labels: the object's name is its pods' host-name prefix (the plan shortens it to leave room)
    name_pattern=r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?",
    name_rule="RFC 1035: lowercase letters, digits and '-', starting with a letter, at most 63",
    handle_scope=("namespace",),
)
