"""What a node runs: the image (or Azure ML environment) each provider's plan names, with the torch and Python it
holds, read from each provider's ``images.json`` (dated, with sources; see docs/images.md) or, for SageMaker, from the
SDK's own image table. A plan names a version whose torch is known rather than a label that moves.

Rules shared by every provider: a torch version the spec asks for must exist there (an error lists what does); the
spec's default torch may be replaced by the nearest one that provider has, with a note saying the clouds now differ;
an image whose Python is older than the bootstrap supports is refused at plan time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import registry
from cloudtrain.contract import RUNTIME_MIN_TORCH
from cloudtrain.errors import ProviderNotFound, SpecError

if TYPE_CHECKING:
    from cloudtrain.spec.model import JobSpec

# the rules every provider shares (oldest Python ...)
DATA = Path(__file__).resolve().parent.parent / "data" / "images.json"


def _title(provider: str) -> str:
    return registry.declaration(provider).title or provider


@dataclass(frozen=True)
class Runtime:
    """The image every node of a plan runs, and what it holds."""

    image: str  # image URI, or an Azure ML environment reference
    torch: str | None  # "2.5.1"; a minor ("2.4") where the image follows a minor's patch releases; None: unknown
    python: str | None  # "3.10"; None: unknown (a custom image)
    source: str  # where torch and Python come from
    pinned: bool  # the reference fixes the torch release (False: a moving tag, or a custom image)

    def summary(self) -> str:
        if self.source == THIS_MACHINE:
            torch = f"torch {self.torch}" if self.torch else "no torch installed"
            return f"{torch}, Python {self.python} (this machine)"
        if self.torch is None:
            return "torch and Python of your image (only known on the node)"
        moving = "" if self.pinned or self.torch.count(".") > 1 else ".x (the image follows this minor's patches)"
        return f"torch {self.torch}{moving}, Python {self.python}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


THIS_MACHINE = "this machine"


def this_machine() -> Runtime:
    """What a job that runs here runs: this Python and the torch installed beside it, read without importing torch."""
    from importlib import metadata

    try:
        torch: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return Runtime(image="this machine's Python and torch", torch=torch, python=python, source=THIS_MACHINE,
                   pinned=True)


def this_python() -> str:
    """This interpreter as a plan names it: the first of its usual names in its own folder (python, python3,
    python3.X) that is this very file, so `python -m cloudtrain` and the `cloudtrain` script (whose #! may say
    python3) plan the same command. Never resolved out of its folder: a virtualenv's python links to the base
    interpreter, and only the path inside the virtualenv loads its packages."""
    exe = sys.executable
    folder, name = os.path.split(exe)
    suffix = os.path.splitext(name)[1] if name.lower().endswith(".exe") else ""
    for candidate in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        path = os.path.join(folder, candidate + suffix)
        with contextlib.suppress(OSError):
            if path == exe or os.path.samefile(path, exe):
                return path
    return exe


def torch_note(provider: str, runtime: Runtime | None, spec: JobSpec) -> str | None:
    """One line when the torch of this machine (where a local run tries the script) and the torch of the cloud
    image differ in minor version: a local plan compares this machine's with the spec's image.torch_version, a
    cloud plan its image's with this machine's. None where either is unknown (no torch here, a custom image)."""
    here = this_machine().torch
    if here is None or runtime is None:
        return None
    if runtime.source == THIS_MACHINE:
        cloud = None if spec.image.uri else spec.image.torch_version
        if cloud is None or minor(cloud) == minor(here):
            return None
        return (f"{provider}: TORCH {minor(here)} HERE, {minor(cloud)} IN THE CLOUD: this machine runs torch {here}, "
                f"a cloud image torch {cloud} (image.torch_version): a run here does not show that the script works "
                f"there; test with torch=={minor(cloud)}.* here, or choose image.torch_version")
    if runtime.torch is None or minor(runtime.torch) == minor(here):
        return None
    return (f"{provider}: TORCH {minor(runtime.torch)} ON THE NODES, {minor(here)} HERE: the nodes run torch "
            f"{runtime.torch}, this machine (where a local run tries the script) torch {here}: test with "
            f"torch=={minor(runtime.torch)}.* here, or choose image.torch_version")


def runtime_note(provider: str, runtime: Runtime | None) -> str | None:
    """One line when the nodes' torch is older than cloudtrain.runtime's Checkpointer runs on: a script built on it
    (the reference trainers) would stop before training, on every node, after the machines started."""
    if runtime is None or runtime.torch is None or version_key(minor(runtime.torch)) >= version_key(RUNTIME_MIN_TORCH):
        return None
    return (f"{provider}: TORCH {minor(runtime.torch)} IS TOO OLD FOR CLOUDTRAIN.RUNTIME: the nodes run torch "
            f"{runtime.torch}, and cloudtrain.runtime's Checkpointer (the reference trainers use it) needs torch "
            f"{RUNTIME_MIN_TORCH} or newer: a script built on it stops before training; choose image.torch_version "
            f"{RUNTIME_MIN_TORCH} or newer, or save checkpoints with your own code (checkpoint.dir)")


@functools.cache
def data() -> dict[str, Any]:
    """The rules every provider shares (``min_python`` ...); a provider's own image table is `table`."""
    return dict(json.loads(DATA.read_text(encoding="utf-8")))


@functools.cache
def table(provider: str) -> dict[str, Any]:
    """The image table a provider ships (``images`` in its registry entry, a plugin's too), read when first asked:
    a plan reads its own provider's only. {} when it declares none."""
    decl = registry.declaration(provider)
    return dict(decl.data("images")) if decl.images else {}


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def check_python(python: str, provider: str, what: str) -> None:
    """Refuse an image whose Python the bootstrap cannot run on (it would fail on every node after the VMs start)."""
    oldest = data()["min_python"]
    if version_key(python) < version_key(oldest):
        raise SpecError(f"{what} runs Python {python}; cloudtrain's bootstrap needs Python {oldest} or newer",
                        field="image.torch_version",
                        remedy=f"choose a newer torch version on {_title(provider)}, or set "
                               "image.uri to an image with a newer Python")


def choose_minor(provider: str, offered: list[str], spec: JobSpec) -> tuple[str, list[str]]:
    """The torch minor this provider runs for ``spec``: the one asked for (it must exist), or for the default one
    the nearest this provider has (older first), with a note that the clouds now run different torch minors."""
    wanted = minor(spec.image.torch_version)
    if wanted in offered:
        return wanted, []
    ordered = sorted(offered, key=version_key)
    if "torch_version" in spec.image.model_fields_set:
        raise SpecError(f"{_title(provider)} has no PyTorch {spec.image.torch_version} image cloudtrain knows",
                        field="image.torch_version",
                        remedy=f"use one of {', '.join(ordered)}, or set image.uri to an image with torch")
    older = [v for v in ordered if version_key(v) < version_key(wanted)]
    chosen = older[-1] if older else ordered[0]
    common = common_minors()
    # none of them may run cloudtrain.runtime: then the advice is for a script that saves its own checkpoints
    too_old = (f" (a script that saves its own checkpoints: cloudtrain.runtime's Checkpointer needs torch "
               f"{RUNTIME_MIN_TORCH} or newer)" if common and all(version_key(v) < version_key(RUNTIME_MIN_TORCH)
                                                                for v in common) else "")
    return chosen, [f"{provider}: TORCH DIFFERS: {_title(provider)} has no PyTorch {wanted} image, so these nodes "
                    f"run torch {chosen} while the default spec runs {wanted} elsewhere; set image.torch_version to "
                    f"a version every cloud has ({', '.join(common)}) to run the same torch everywhere{too_old}"]


def common_minors() -> list[str]:
    """Torch minors every provider with images has a known image for (each provider's ``torch_minors``, plugins'
    too; one whose table is not installed, such as SageMaker's without sagemaker-core, is left out)."""
    minors: set[str] | None = None
    for name in registry.names():
        try:
            decl = registry.declaration(name)
            if not decl.torch_minors:
                continue
            offered = set(decl.load("torch_minors")())
        except (SpecError, ProviderNotFound):  # a table not installed, a plugin that cannot be loaded
            continue
        minors = offered if minors is None else minors & offered
    return sorted(minors or set(), key=version_key)


def custom(uri: str) -> Runtime:
    return Runtime(image=uri, torch=None, python=None, source="image.uri (its contents are yours)", pinned=False)


def python_for(provider: str, available: str, spec: JobSpec, what: str) -> list[str]:
    """The image's Python against the spec's: an explicit other version is an error; the default one follows the
    image (the plan shows which)."""
    check_python(available, provider, what)
    if spec.image.python_version == available:
        return []
    if "python_version" in spec.image.model_fields_set:
        raise SpecError(f"{what} has Python {available}, not {spec.image.python_version}",
                        field="image.python_version", remedy=f"use {available}, or set image.uri")
    return []  # the plan shows the Python each node runs
