"""``providers.kubernetes`` in a job spec (and in a profile): which cluster and namespace, which Kubeflow API and
runtime, where the bundle is staged, and what each node's pod asks for."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from cloudtrain.spec.fields import Duration, Model, one_token
from cloudtrain.storage.uris import check_uri

STAGING = re.compile(r"^(s3|gs|az)://[^/\s]+(/\S*)?$|^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/\S*)?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class KubernetesOptions(Model):
    api: Literal["trainjob", "pytorchjob"] = Field(
        "trainjob", description="trainjob: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1); "
                                "pytorchjob: a Training Operator v1 PyTorchJob (kubeflow.org/v1), for clusters still "
                                "on Training Operator 1.x")
    context: str | None = Field(None, description="The kubeconfig context (default: the current one; inside a pod: "
                                                  "its service account)")
    namespace: str | None = Field(None, description="The namespace jobs go to (default: the context's, else "
                                                    "'default')")
    staging: str | None = Field(
        None, description="Where the bundle goes before the nodes start (required to submit): s3://, gs:// or "
                          "az://BUCKET/prefix (the nodes fetch it with their service account's cloud identity), or "
                          "pvc://CLAIM/path: a ReadWriteMany claim mounted on every node (the bundle travels in "
                          "ConfigMaps; checkpoints and outputs default to the claim)")
    image: str | None = Field(None, description="The nodes' image, with torch (default: image.uri, else the "
                                                "runtime's own image)")
    runtime: str = Field("torch-distributed", description="The TrainJob's runtimeRef: a ClusterTrainingRuntime "
                                                          "(or TrainingRuntime, runtime_kind) with the torch policy")
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        "ClusterTrainingRuntime", description="The runtimeRef's kind (TrainingRuntime: one in the job's namespace)")
    queue: str | None = Field(None, description="A Kueue LocalQueue: the job carries kueue.x-k8s.io/queue-name and "
                                                "is created suspended until Kueue admits it")
    service_account: str | None = Field(None, description="The pods' service account (its cloud identity reads the "
                                                          "staging bucket and writes checkpoints)")
    gpu_resource: str = Field("nvidia.com/gpu", description="The extended resource --gpus asks for per node")
    cpus_per_node: int | None = Field(None, ge=1, le=4096, description="CPUs each node's pod requests")
    memory: str | None = Field(None, pattern=r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$",
                               description="Memory each node's pod requests (a Kubernetes quantity, e.g. '64Gi')")
    node_selector: dict[str, str] = Field(default_factory=dict,
                                          description="Node labels the pods must run on (a spot node pool: e.g. "
                                                      "cloud.google.com/gke-spot: 'true')")
    tolerations: list[dict[str, Any]] = Field(default_factory=list,
                                              description="Pod tolerations (a tainted GPU or spot node pool)")
    python: str = Field("python3", description="The Python in the image that runs the bootstrap")
    grace_period: Duration = Field(120, le=3600, description="terminationGracePeriodSeconds: how long a node has "
                                                             "after SIGTERM to take a final checkpoint and publish it")
    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = Field(
        "OnFailure", description="pytorchjob: each replica's restartPolicy (runPolicy.backoffLimit is max_restarts)")

    _tokens = field_validator("context", "image", "service_account", "python", "gpu_resource")(
        lambda value: one_token(value) if value else value)

    @field_validator("namespace", "runtime", "queue")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not DNS_LABEL.match(value)):
            raise ValueError(f"{value!r} is not a Kubernetes name (lowercase letters, digits and '-', at most 63, "
                             "starting and ending with a letter or digit)")
        return value

    @field_validator("staging")
    @classmethod
    def _staging(cls, value: str | None) -> str | None:
        if value is not None and not STAGING.match(value):
            raise ValueError(f"{value!r}: use s3://BUCKET/prefix, gs://BUCKET/prefix, az://CONTAINER/prefix or "
                             "pvc://CLAIM/path")
        if value and not value.startswith("pvc://"):  # a bucket its store refuses: here, not as the derived URIs
            check_uri(value)  # (output_uri, checkpoint.uri) fail their own checks at plan time
        return value.rstrip("/") if value else value
