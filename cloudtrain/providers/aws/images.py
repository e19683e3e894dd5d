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
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import ProviderNotInstalled, SpecError
from cloudtrain.platforms.images import Runtime, check_python, choose_minor, python_for, version_key

if TYPE_CHECKING:
    from cloudtrain.spec.model import JobSpec

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


def _partition_table() -> list[dict[str, Any]]:
    from botocore.loaders import create_loader  # botocore's endpoint data: offline

    return [{"regions": sorted(p.get("regions", {})), "regionRegex": p.get("regionRegex", "$^"),
             "dnsSuffix": p["dnsSuffix"]} for p in create_loader().load_data("endpoints")["partitions"]]


@cache
def _partitions() -> list[dict[str, Any]]:
    """Each AWS partition's regions, region pattern and DNS suffix, from botocore's endpoint data, cached
    (cloudtrain.home.paths.derived): parsing that file and importing botocore's loader cost more than the plan's own
    work."""
    from cloudtrain.home.paths import derived
    from cloudtrain.providers.aws.validate import botocore_stamp

    return list(derived("botocore-partitions", botocore_stamp(), _partition_table, _partition_rows))


def _partition_rows(data: Any) -> list[dict[str, Any]]:
    """The cached table as _partition_table builds it, else ValueError (a cache of another shape is built again)."""
    if not isinstance(data, list) or not all(
            isinstance(p, dict) and isinstance(p.get("regions"), list) and isinstance(p.get("regionRegex"), str)
            and isinstance(p.get("dnsSuffix"), str) for p in data):
        raise ValueError("not a partition table")
    return data


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


def offered_minors() -> list[str]:
    """Torch minors with a SageMaker training image whose Python the bootstrap can run on."""
    config = pytorch_training_config()
    found = []
    for alias, version in config.get("version_aliases", {}).items():
        pythons = _pythons(config["versions"].get(version, {}))
        if alias.count(".") == 1 and pythons and version_key(pythons[-1]) >= (3, 8):
            found.append(alias)
    return sorted(found, key=version_key)


def _pythons(entry: dict[str, Any]) -> list[str]:
    """An entry's Python versions as numbers ("py311" -> "3.11", "py3"/"py36" -> "3.6": SageMaker's py3 images of
    that era ran 3.6), oldest first."""
    found = []
    for py in entry.get("py_versions") or []:
        digits = py[2:]
        if digits.startswith("3"):
            found.append("3.6" if digits in ("3", "36") else f"3.{digits[1:]}")
    return sorted(found, key=version_key)


def runtime_for(spec: JobSpec, instance_type: str, region: str) -> tuple[Runtime, list[str]]:
    """The prebuilt image for ``spec``, pinned to a full torch release (the tag never changes its torch), with
    the torch and Python it holds."""
    config = pytorch_training_config()
    asked = spec.image.torch_version
    if asked.count(".") == 2:  # a full release: exactly that one
        version, notes = asked, list[str]()
        if version not in config["versions"]:
            offered = ", ".join(offered_minors()[-8:])
            raise SpecError(f"SageMaker has no PyTorch {asked} training image", field="image.torch_version",
                            remedy=f"use one of {offered}, or set image.uri to your own image")
    else:
        too_old = config.get("version_aliases", {}).get(".".join(asked.split(".")[:2]))
        if too_old and _pythons(config["versions"][too_old]):  # SageMaker has it, on a Python the bootstrap can't run
            check_python(_pythons(config["versions"][too_old])[-1], "aws", f"the SageMaker PyTorch {too_old} image")
        chosen, notes = choose_minor("aws", offered_minors(), spec)
        version = config["version_aliases"][chosen]
    pythons = _pythons(config["versions"][version])
    what = f"the SageMaker PyTorch {version} image"
    if not pythons:
        raise SpecError(f"{what} has no Python 3 build", field="image.torch_version", remedy="choose a newer torch")
    python = spec.image.python_version if spec.image.python_version in pythons else pythons[-1]
    check_python(python, "aws", what)
    notes += python_for("aws", python, spec, what)
    image = training_image(version, python, instance_type, region)
    return Runtime(image=image, torch=version, python=python, source="sagemaker-core's image table (offline)",
                   pinned=True), notes
