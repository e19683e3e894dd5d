"""The prebuilt Vertex AI PyTorch training container for a spec and region.

google-cloud-aiplatform ships lists of prediction and Ray images but none of training images, so the table in
``images.json`` in this folder follows Google's "Prebuilt containers for custom training" page. Vertex accepts these
images only by their ``:latest`` tag, and each follows one torch minor: the plan says so. The GPU build is used on CPU
machines too (a CUDA build of torch runs on CPU), so one image serves a job whatever its machines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain.platforms import images
from cloudtrain.platforms.images import Runtime

if TYPE_CHECKING:
    from cloudtrain.spec.model import JobSpec


def registry_for(region: str) -> str:
    """Vertex serves its images from three multi-region Artifact Registry hosts."""
    if region.startswith(("europe-", "me-")):
        return "europe-docker.pkg.dev"
    if region.startswith(("asia-", "australia-")):
        return "asia-docker.pkg.dev"
    return "us-docker.pkg.dev"


def runtime_for(spec: JobSpec, region: str) -> tuple[Runtime, list[str]]:
    """The image URI with the torch and Python it holds, and notes. A version the spec left at its default may be
    replaced by the nearest one Vertex has (with a note); a version the spec asked for must exist."""
    table = images.table("gcp")["containers"]
    version, notes = images.choose_minor("gcp", list(table), spec)
    entry = table[version]
    what = f"the Vertex PyTorch {version} container"
    notes += images.python_for("gcp", entry["python"], spec, what)
    uri = f"{registry_for(region)}/vertex-ai/training/{entry['tag']}:latest"
    return Runtime(image=uri, torch=entry["torch"], python=entry["python"], pinned=False,
                   source=f"Vertex's prebuilt training containers page, as of {images.table('gcp')['as_of']}"), notes


def offered_minors() -> list[str]:
    """The torch minors a prebuilt container is known for."""
    return list(images.table("gcp")["containers"])
