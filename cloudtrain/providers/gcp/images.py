"""The prebuilt Vertex AI PyTorch training container for a torch version and region.

google-cloud-aiplatform ships lists of prediction and Ray images but none of training images, so the table below
follows Google's "Prebuilt containers for custom training" page. The GPU build is used on CPU machines too (a CUDA
build of torch runs on CPU), so one image serves a job whatever its machines.
"""

from __future__ import annotations

from cloudtrain.errors import SpecError

# torch version -> Python version of the image (Vertex builds one Python per torch release).
PYTORCH_GPU: dict[str, str] = {"2.4": "3.10", "2.3": "3.10", "2.2": "3.10", "2.1": "3.10", "2.0": "3.10",
                               "1.13": "3.10"}
NEWEST = "2.4"


def registry_for(region: str) -> str:
    """Vertex serves its images from three multi-region Artifact Registry hosts."""
    if region.startswith(("europe-", "me-")):
        return "europe-docker.pkg.dev"
    if region.startswith(("asia-", "australia-")):
        return "asia-docker.pkg.dev"
    return "us-docker.pkg.dev"


def training_image(torch_version: str, python_version: str, region: str, *, torch_set: bool = True,
                   python_set: bool = True) -> tuple[str, list[str]]:
    """The image URI and notes. A version the spec left at its default may be replaced by the nearest one Vertex
    has (with a note); a version the spec asked for explicitly must exist."""
    notes: list[str] = []
    version = ".".join(torch_version.split(".")[:2])
    if version not in PYTORCH_GPU:
        if torch_set:
            offered = ", ".join(sorted(PYTORCH_GPU, key=lambda v: tuple(int(p) for p in v.split("."))))
            raise SpecError(f"Vertex has no prebuilt PyTorch {torch_version} training container",
                            field="image.torch_version", remedy=f"use one of {offered}, or set image.uri")
        notes.append(f"gcp: Vertex has no prebuilt PyTorch {torch_version} training container; using {NEWEST} "
                     "(set image.torch_version or image.uri to choose)")
        version = NEWEST
    python = PYTORCH_GPU[version]
    if python_version != python:
        if python_set:
            raise SpecError(f"the Vertex PyTorch {version} container has Python {python}, not {python_version}",
                            field="image.python_version", remedy=f"use {python}, or set image.uri")
        notes.append(f"gcp: the Vertex PyTorch {version} container runs Python {python}")
    tag = f"pytorch-gpu.{version.replace('.', '-')}.py{python.replace('.', '')}"
    return f"{registry_for(region)}/vertex-ai/training/{tag}:latest", notes
