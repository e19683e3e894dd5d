"""Providers are found by name through a lazy registry: nothing heavy is imported until one is asked for.

Third-party packages add providers through the ``cloudtrain.providers`` entry-point group; they add to the
built-ins and never replace them.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cloudtrain.errors import ProviderNotFound, ProviderNotInstalled

if TYPE_CHECKING:
    from cloudtrain.providers.base import Provider


@dataclass(frozen=True)
class ProviderEntry:
    target: str | None  # "module:Class"; None while the provider is not implemented yet
    extra: str  # the pip extra that installs what it needs
    requires: tuple[str, ...]  # top-level modules that must be importable
    summary: str


BUILTIN: dict[str, ProviderEntry] = {
    "local": ProviderEntry("cloudtrain.providers.local.provider:LocalProvider", "local", ("torch",),
                           "torchrun processes with gloo on this machine"),
    "aws": ProviderEntry("cloudtrain.providers.aws.provider:SageMakerProvider", "aws", ("boto3",),
                         "Amazon SageMaker training jobs"),
    "azure": ProviderEntry("cloudtrain.providers.azure.provider:AzureMLProvider", "azure", ("azure.ai.ml",),
                           "Azure Machine Learning command jobs"),
    "gcp": ProviderEntry("cloudtrain.providers.gcp.provider:VertexProvider", "gcp", ("google.cloud.aiplatform_v1",),
                         "Google Vertex AI custom jobs"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module blocked with sys.modules[m] = None
        return False


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="cloudtrain.providers")}


def available() -> dict[str, ProviderEntry]:
    """Every provider name: built-ins first, then plugins (which never shadow a built-in)."""
    found = dict(BUILTIN)
    for name, target in _entry_points().items():
        found.setdefault(name, ProviderEntry(target, name, (), f"plugin {target}"))
    return found


def get_provider(name: str) -> Provider:
    entry = BUILTIN.get(name) or available().get(name)
    if entry is None:
        raise ProviderNotFound(f"unknown provider {name!r}", field="--provider",
                               remedy="choose one of: " + ", ".join(available()))
    if entry.target is None:
        raise ProviderNotFound(
            f"provider {name!r} ({entry.summary}) is not available in this version of cloudtrain yet",
            field="--provider", remedy="use --provider local, or --dry-run with a provider that is available")
    missing = [m for m in entry.requires if not _installed(m)]
    if missing:
        raise ProviderNotInstalled(
            f"provider {name!r} needs {', '.join(missing)}, which is not installed", field="--provider",
            remedy=f"pip install 'cloudtrain[{entry.extra}]'")
    module_name, _, attr = entry.target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    return cls()
