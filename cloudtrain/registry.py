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
when every provider is listed (``doctor``, ``config``, ``schema``, choices in ``--help``): reading them costs ~50 ms
(importlib.metadata), which ``cloudtrain --help`` does not pay.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
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
                           "azure": "cloudtrain.providers.azure", "gcp": "cloudtrain.providers.gcp"}
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


def _plugin_entries() -> dict[str, Any]:
    """``cloudtrain.providers`` entry points by name (the first of a name wins, as importlib.metadata orders them);
    read afresh each time (sys.path may change, e.g. in tests)."""
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def _from_entry(name: str, ep: Any) -> Declaration:
    try:
        loaded = ep.load()
    except Exception as exc:  # a broken plugin must not break every command
        raise ProviderNotFound(f"provider {name!r} ({ep.value}) cannot be loaded: {type(exc).__name__}: {exc}",
                               field="--provider", remedy="reinstall the package that provides it") from None
    if isinstance(loaded, Declaration):
        return loaded if loaded.name == name else replace(loaded, name=name)
    # a bare Provider subclass (the older form): a provider with no options, checks or contract of its own
    module, _, attr = ep.value.partition(":")
    package, _, leaf = module.rpartition(".")
    return Declaration(name=name, summary=f"plugin {ep.value}", package=package or module,
                       provider=f"{leaf if package else ''}:{attr}")


def plugins() -> dict[str, Declaration]:
    """Declarations registered through entry points, less any that would shadow a built-in."""
    return {name: _from_entry(name, ep) for name, ep in _plugin_entries().items() if name not in BUILTIN}


def names() -> list[str]:
    """Every provider: built-ins first, then plugins."""
    return [*BUILTIN, *(name for name in _plugin_entries() if name not in BUILTIN)]


def declaration(name: str) -> Declaration:
    if name in BUILTIN:
        return _builtin_declaration(name)
    ep = _plugin_entries().get(name)
    if ep is None:
        raise ProviderNotFound(f"unknown provider {name!r}", field="--provider",
                               remedy="choose one of: " + ", ".join(names()))
    return _from_entry(name, ep)


def declarations() -> dict[str, Declaration]:
    return {name: declaration(name) for name in names()}


def exists(name: str) -> bool:
    return name in BUILTIN or name in _plugin_entries()


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
