"""Providers by name: what each declares (its options, settings, checks, node contract, catalog ...) and its
implementation, found without importing anything heavy.

A provider is one folder (a package). Its ``__init__.py`` holds a ``Declaration`` (plain data: names, strings,
no SDK and no pydantic), and each role lives in a module of that folder under the same name in every provider:
``provider.py`` (the ``Provider`` subclass), ``options.py`` (the ``providers.<name>`` block of a spec), ``node.py``
(the node contract: standard library only, shipped to the nodes), ``doctor.py`` (its checks), ``settings.py`` (where
its settings come from besides the spec, the environment and cloudtrain's profile), ``export.py`` (``plan --export``),
``catalog.json`` (machines and prices). A declaration names the roles it has as ``"module:attribute"`` relative to
its folder; the core reads them here and nowhere else.

Built-in providers are known by name without importing anything. Third-party providers register a declaration
(``"package:DECLARATION"``; a bare ``Provider`` subclass also works) in the ``cloudtrain.providers`` entry-point
group; they add to the built-ins and never replace them. Entry points are read only when a name is not built in or
when every provider is listed (``doctor``, ``config``, ``schema``, ``catalog``, choices in ``--help``), and then from
the distributions' entry_points.txt directly (~3 ms; importlib.metadata's import alone is ~35 ms); ``cloudtrain
--help`` reads none.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import ProviderNotFound, ProviderNotInstalled

if TYPE_CHECKING:
    from types import ModuleType

    from cloudtrain.providers.base import Provider

GROUP = "cloudtrain.providers"
# name -> the folder that declares it: the only place the core names a provider
BUILTIN: dict[str, str] = {"local": "cloudtrain.providers.local", "aws": "cloudtrain.providers.aws",
                           "azure": "cloudtrain.providers.azure", "gcp": "cloudtrain.providers.gcp",
                           "slurm": "cloudtrain.providers.slurm",
                           "kubernetes": "cloudtrain.providers.kubernetes"}
PLAIN_NODE = "cloudtrain.providers.local.node"  # cloudtrain's own node contract (CLOUDTRAIN_NNODES ...)


@dataclass(frozen=True)
class Declaration:
    """What a provider is and where its parts are. Roles are ``"module:attribute"`` (or ``"module"``) relative to
    ``package``; None: the provider has no such part."""

    name: str  # as in --provider, handles (name://...) and the spec's providers.<name>
    summary: str  # one line, shown in --help and doctor
    package: str  # the provider's folder, e.g. "cloudtrain.providers.aws"
    provider: str = "provider:Provider"  # the Provider subclass
    title: str = ""  # the platform's name in messages ("SageMaker"); default: the name
    extra: str = ""  # the pip extra that installs what it needs (pip install 'cloudtrain[<extra>]')
    requires: tuple[str, ...] = ()  # top-level modules that must be importable to use it
    distribution: str = "cloudtrain"  # whose extra that is (a plugin names its own distribution)
    options: str | None = None  # the pydantic model of the spec's providers.<name> block
    # environment variables per setting, first set wins: where `config` and the plan look after the spec
    env: dict[str, tuple[str, ...]] = field(default_factory=dict)
    settings: str | None = None  # fn(key) -> (value, where) | None: the platform's own tools (gcloud, az ...)
    placeholders: dict[str, str] = field(default_factory=dict)  # setting -> what a plan shows while it is unset
    doctor: str | None = None  # fn(ctx) -> list[Check]
    node: str | None = None  # the node contract module (standard library only); None: cloudtrain's own
    platform: str | None = None  # the node contract's name, as ``--emulate`` takes it (default: the name)
    catalog: str | None = None  # a JSON file in the folder: machines and list prices
    instance_option: str | None = None  # the option that names a machine explicitly (for catalog messages)
    images: str | None = None  # a JSON file in the folder: the images its plans pick, dated
    torch_minors: str | None = None  # fn() -> torch minors it has an image for
    export: str | None = None  # module: export(plan, request, folder) -> files (`plan --export`); unset(plan)

    @property
    def platform_name(self) -> str:
        return self.platform or self.name

    def load(self, role: str) -> Any:
        """The object a role names (``doctor`` -> the checks function ...), imported now."""
        target = getattr(self, role)
        if target is None:
            raise LookupError(f"provider {self.name!r} declares no {role}")
        module, _, attr = target.partition(":")
        loaded = importlib.import_module(self._module(module))
        return getattr(loaded, attr) if attr else loaded

    def node_module(self) -> str:
        """The dotted name of the node contract module (what the bootstrap loads from the bundle's lib/)."""
        return self._module(self.node) if self.node else PLAIN_NODE

    def node_path(self) -> str:
        """The node contract's file under the bundle's lib/ (the bootstrap's ``--node-contract``)."""
        return self.node_module().replace(".", "/") + ".py"

    def node_file(self) -> Path:
        """The node contract's source file here (packaging ships a plugin's into the bundle's lib/)."""
        spec = importlib.util.find_spec(self.node_module())
        if spec is None or not spec.origin:
            raise ProviderNotFound(f"provider {self.name!r}: node contract {self.node_module()!r} is not importable")
        return Path(spec.origin)

    def data(self, role: str) -> Any:
        """A JSON file the provider ships in its folder (``catalog``, ``images``)."""
        name = getattr(self, role)
        if name is None:
            raise LookupError(f"provider {self.name!r} declares no {role}")
        return json.loads((self.folder() / name).read_text(encoding="utf-8"))

    def folder(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ProviderNotFound(f"provider {self.name!r}: package {self.package!r} is not importable")
        return Path(next(iter(spec.submodule_search_locations)))

    def _module(self, relative: str) -> str:
        return f"{self.package}.{relative}" if relative else self.package


def builtin(name: str) -> bool:
    return name in BUILTIN


@cache
def _builtin_declaration(name: str) -> Declaration:
    found = importlib.import_module(BUILTIN[name]).PROVIDER
    assert isinstance(found, Declaration) and found.name == name
    return found


def _entry_points() -> dict[str, str]:
    """``cloudtrain.providers`` entry points (name -> "module:attr"), read from the installed distributions'
    ``entry_points.txt`` on sys.path, first distribution of a name first (as importlib.metadata orders them), read
    afresh each time (sys.path may change). Read directly: importing importlib.metadata alone costs ~35 ms, this
    whole scan ~3 ms (tests/test_conformance.py checks both find the same)."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    for folder in sys.path:
        try:
            entries = sorted(os.scandir(folder or "."), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            dist = re.sub(r"[-_.]+", "_", entry.name.rsplit(".", 1)[0].split("-")[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                text = Path(entry.path, "entry_points.txt").read_text(encoding="utf-8")
            except OSError:
                continue
            for name, value in _group(text, GROUP):
                found.setdefault(name, value)
    return found


def _group(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of one [group] of an entry_points.txt."""
    lines, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            inside = line == f"[{group}]"
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            lines.append((name.strip(), value.strip()))
    return lines


def _from_entry(name: str, value: str) -> Declaration:
    module, _, attr = value.partition(":")
    try:
        loaded: Any = importlib.import_module(module.strip())
        for part in attr.strip().split(".") if attr.strip() else []:
            loaded = getattr(loaded, part)
    except Exception as exc:  # a broken plugin must not break every command
        raise ProviderNotFound(f"provider {name!r} ({value}) cannot be loaded: {type(exc).__name__}: {exc}",
                               field="--provider", remedy="reinstall the package that provides it") from None
    if isinstance(loaded, Declaration):
        return loaded if loaded.name == name else replace(loaded, name=name)
    # a bare Provider subclass (the older form): a provider with no options, checks or contract of its own
    package, _, leaf = module.rpartition(".")
    return Declaration(name=name, summary=f"plugin {value}", package=package or module,
                       provider=f"{leaf if package else ''}:{attr}")


def plugins() -> dict[str, Declaration]:
    """Declarations registered through entry points, less any that would shadow a built-in."""
    return {name: _from_entry(name, value) for name, value in _entry_points().items() if name not in BUILTIN}


def names() -> list[str]:
    """Every provider: built-ins first, then plugins."""
    return [*BUILTIN, *(name for name in _entry_points() if name not in BUILTIN)]


def declaration(name: str) -> Declaration:
    if name in BUILTIN:
        return _builtin_declaration(name)
    value = _entry_points().get(name)
    if value is None:
        raise ProviderNotFound(f"unknown provider {name!r}", field="--provider",
                               remedy="choose one of: " + ", ".join(names()))
    return _from_entry(name, value)


def declarations() -> dict[str, Declaration]:
    return {name: declaration(name) for name in names()}


def exists(name: str) -> bool:
    return name in BUILTIN or name in _entry_points()


def by_platform(platform: str) -> Declaration | None:
    """The provider whose node contract is called ``platform`` (``--emulate sagemaker``), or named so."""
    for decl in (_builtin_declaration(n) for n in BUILTIN):
        if platform in (decl.platform_name, decl.name):
            return decl
    return next((d for d in plugins().values() if platform in (d.platform_name, d.name)), None)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module blocked with sys.modules[m] = None
        return False


def get_provider(name: str) -> Provider:
    decl = declaration(name)
    missing = [m for m in decl.requires if not _installed(m)]
    if missing:
        what = f"'{decl.distribution}[{decl.extra}]'" if decl.extra else decl.distribution
        raise ProviderNotInstalled(f"provider {name!r} needs {', '.join(missing)}, which is not installed",
                                   field="--provider", remedy=f"pip install {what}")
    cls = decl.load("provider")
    return cls()


def node_contract(name: str) -> ModuleType:
    """A provider's node contract module, imported here (the planner's copy of what the bootstrap loads)."""
    return importlib.import_module(declaration(name).node_module())
