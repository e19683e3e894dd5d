"""The prebuilt SageMaker PyTorch training image for a torch/python version, region and instance type.

Resolved offline from the image config the SageMaker SDK ships (``sagemaker-core``), read as a data file: importing
the SDK takes seconds (pandas, scipy), reading its JSON a few milliseconds. The rules below are the subset of
``sagemaker.core.image_uris.retrieve`` that applies to PyTorch training images; a test compares the two.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from cloudtrain.errors import ProviderNotInstalled, SpecError

_CONFIG = "sagemaker/core/image_uri_config/pytorch.json"


@cache
def pytorch_training_config() -> dict[str, Any]:
    try:
        dist = metadata.distribution("sagemaker-core")
    except metadata.PackageNotFoundError:
        raise ProviderNotInstalled("the SageMaker image catalogue (sagemaker-core) is not installed",
                                   field="image", remedy="pip install 'cloudtrain[aws]', or set image.uri") from None
    path = Path(str(dist.locate_file(_CONFIG)))
    if not path.is_file():  # an unusual install layout: look the file up in the distribution's record
        found = [f for f in dist.files or [] if str(f).endswith(_CONFIG)]
        path = Path(str(dist.locate_file(found[0]))) if found else path
    return dict(json.loads(path.read_text())["training"])


@cache
def _partitions() -> list[dict[str, Any]]:
    from botocore.loaders import create_loader  # botocore's endpoint data: offline, a few milliseconds

    return list(create_loader().load_data("endpoints")["partitions"])


def _ecr_domain(region: str) -> str:
    """The DNS suffix of the region's partition (amazonaws.com, amazonaws.com.cn, the isolated clouds ...)."""
    for partition in _partitions():
        if region in partition.get("regions", {}) or re.match(partition.get("regionRegex", "$^"), region):
            return str(partition["dnsSuffix"])
    return "amazonaws.com"


def processor_for(instance_type: str, available: list[str]) -> str:
    family = instance_type.split(".")[1] if instance_type.count(".") == 2 else instance_type
    if family in available:
        return family
    if family.startswith("trn"):
        return "trn"
    return "gpu" if family[:1] in ("g", "p") else "cpu"


def training_image(torch_version: str, python_version: str, instance_type: str, region: str) -> str:
    config = pytorch_training_config()
    aliases: dict[str, str] = config.get("version_aliases", {})
    version = aliases.get(torch_version, torch_version)
    versions: dict[str, Any] = config["versions"]
    if version not in versions:
        offered = sorted(aliases, key=lambda v: tuple(int(p) for p in v.split(".")))
        raise SpecError(f"SageMaker has no PyTorch {torch_version} training image", field="image.torch_version",
                        remedy=f"use one of {', '.join(offered[-8:])}, or set image.uri to your own image")
    entry = versions[version]
    py = "py" + python_version.replace(".", "")
    py_versions = entry.get("py_versions") or []
    if py not in py_versions:
        offered_py = ", ".join(f"{p[2]}.{p[3:]}" if len(p) > 3 else p[2] for p in py_versions)  # py311, py3
        raise SpecError(f"the SageMaker PyTorch {version} image has no Python {python_version}",
                        field="image.python_version", remedy=f"use {offered_py}, or set image.uri")
    entry = entry.get(py) or entry
    registries: dict[str, str] = entry["registries"]
    if region not in registries:
        raise SpecError(f"no SageMaker PyTorch image in region {region!r}", field="providers.aws.region",
                        remedy="choose a region SageMaker serves, or set image.uri")
    available = config.get("processors") or entry.get("processors") or []
    processor: str | None = processor_for(instance_type, available)
    if processor not in available:
        raise SpecError(f"the SageMaker PyTorch {version} image has no {processor} build for {instance_type}",
                        field="providers.aws.instance_type", remedy=f"use an instance with: {', '.join(available)}")
    container_version = (entry.get("container_version") or {}).get(processor)
    if not entry.get("processor_in_tag", True):
        processor = None
    # like the SDK, the tag carries the version as asked ("2.5" -> the rolling 2.5 tag; "2.5.1" pins the patch)
    tag = "-".join(x for x in (entry.get("tag_prefix", torch_version), processor, py, container_version) if x)
    return f"{registries[region]}.dkr.ecr.{region}.{_ecr_domain(region)}/{entry['repository']}:{tag}"
