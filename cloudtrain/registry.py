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
import os
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from cloudtrain import contract
from cloudtrain.entry_points import Entry, scan
from cloudtrain.errors import ProviderNotFound, ProviderNotInstalled
from cloudtrain.job_types import PLAIN_NODE, Declaration

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["BUILTIN", "GROUP", "PLAIN_NODE", "Declaration", "declaration", "declarations", "get_provider", "names",
           "node_contract", "plugins"]

GROUP = "cloudtrain.providers"
# name -> the folder that declares it: the only place the core names a provider
BUILTIN: dict[str, str] = {"local": "cloudtrain.providers.local", "aws": "cloudtrain.providers.aws",
                           "azure": "cloudtrain.providers.azure", "gcp": "cloudtrain.providers.gcp",
                           "slurm": "cloudtrain.providers.slurm",
                           "kubernetes": "cloudtrain.providers.kubernetes"}


def builtin(name: str) -> bool:
    return name in BUILTIN


@cache
def _builtin_declaration(name: str) -> Declaration:
    found = importlib.import_module(BUILTIN[name]).PROVIDER
    assert isinstance(found, Declaration) and found.name == name
    return found


PLUGINS_ENV = contract.PLUGINS  # unset: every installed plugin; "none": none; "a,b": only those


def _scan(path: tuple[str, ...]) -> dict[str, Entry]:
    """``cloudtrain.providers`` entry points on ``path`` (tests/test_conformance.py checks importlib.metadata finds
    the same)."""
    return scan(path, GROUP)


def _mtime(path: str) -> int:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return -1


# The last scan and what it depended on: sys.path, each entry's mtime (installing or removing a distribution adds or
# removes its .dist-info folder there), each plugin's .dist-info mtime, and the switch. Checking that costs a stat per
# sys.path entry (~20 us); rescanning costs ~3-13 ms, which every lookup of a plugin used to pay.
_scanned: tuple[tuple[Any, ...], dict[str, Entry]] | None = None
_loaded: dict[Entry, Declaration | str] = {}  # a plugin's declaration, or why it cannot be loaded
_warned: set[Entry] = set()


def _key(path: tuple[str, ...], found: dict[str, Entry] | None) -> tuple[Any, ...]:
    dists = tuple(sorted({e.where for e in found.values()})) if found else ()
    return (path, os.environ.get(PLUGINS_ENV), tuple(_mtime(p) for p in path), tuple(_mtime(d) for d in dists))


def _entries() -> dict[str, Entry]:
    """The entry points of the plugins in use (the switch applied), rescanned only when the key changed."""
    global _scanned
    path = tuple(sys.path)
    if _scanned is not None and _key(path, _scanned[1]) == _scanned[0]:
        return _scanned[1]
    found = _scan(path)
    wanted = os.environ.get(PLUGINS_ENV)
    if wanted is not None:  # the test suites' switch: plugins installed beside cloudtrain stay out of its own tests
        keep = {n.strip() for n in wanted.split(",")} - {"none", ""}
        found = {n: e for n, e in found.items() if n in keep}
    _scanned = (_key(path, found), found)
    return found


def _entry_points() -> dict[str, str]:
    """``cloudtrain.providers`` entry points in use: name -> "module:attr"."""
    return {name: entry.value for name, entry in _entries().items()}


def _from_entry(entry: Entry) -> Declaration:
    """A plugin's declaration, imported once (until its distribution changes). Raises ProviderNotFound, naming the
    distribution, for one that cannot be loaded."""
    if entry not in _loaded:
        try:
            _loaded[entry] = _load_entry(entry)
        except Exception as exc:  # a broken plugin: anything its import raises
            _loaded[entry] = f"{type(exc).__name__}: {exc}"
    found = _loaded[entry]
    if isinstance(found, str):
        raise ProviderNotFound(f"provider {entry.name!r} from distribution {entry.distribution!r} ({entry.value}) "
                               f"cannot be loaded: {found}", field="--provider",
                               remedy=f"reinstall {entry.distribution} (pip install --force-reinstall "
                                      f"{entry.distribution}) or uninstall it")
    return found


def _load_entry(entry: Entry) -> Declaration:
    module, _, attr = entry.value.partition(":")
    loaded: Any = importlib.import_module(module.strip())
    for part in attr.strip().split(".") if attr.strip() else []:
        loaded = getattr(loaded, part)
    if isinstance(loaded, Declaration):
        if loaded.name != entry.name:  # a provider's name is stated once: its declaration's
            raise ValueError(f"the entry point is named {entry.name!r} but its declaration {loaded.name!r}")
        return loaded
    if not isinstance(loaded, type):
        raise TypeError(f"{entry.value} is a {type(loaded).__name__}, not a Declaration")
    # a bare Provider subclass (the older form): a provider with no options, checks or contract of its own
    package, _, leaf = module.rpartition(".")
    return Declaration(name=entry.name, summary=f"plugin {entry.value}", package=package or module,
                       provider=f"{leaf if package else ''}:{attr}", distribution=entry.distribution)


def _usable(entry: Entry) -> Declaration | None:
    """A plugin's declaration, or None (and one warning per process, naming the distribution) when it cannot be
    loaded: a broken plugin never breaks a command that does not name it."""
    try:
        return _from_entry(entry)
    except ProviderNotFound as exc:
        if entry not in _warned:
            _warned.add(entry)
            print(f"cloudtrain: warning: skipping the plugin {entry.name!r} of distribution {entry.distribution!r}: "
                  f"{exc.message.split(' cannot be loaded: ', 1)[-1]}; {exc.remedy}", file=sys.stderr)
        return None


def plugins() -> dict[str, Declaration]:
    """Declarations registered through entry points, less any that would shadow a built-in or cannot be loaded."""
    found = {name: _usable(entry) for name, entry in _entries().items() if name not in BUILTIN}
    return {name: decl for name, decl in found.items() if decl is not None}


def names() -> list[str]:
    """Every provider: built-ins first, then the plugins that load."""
    return [*BUILTIN, *plugins()]


def declaration(name: str) -> Declaration:
    if name in BUILTIN:
        return _builtin_declaration(name)
    entry = _entries().get(name)
    if entry is None:
        raise ProviderNotFound(f"unknown provider {name!r}", field="--provider",
                               remedy="choose one of: " + ", ".join(names()))
    return _from_entry(entry)


def declarations() -> dict[str, Declaration]:
    return {**{name: _builtin_declaration(name) for name in BUILTIN}, **plugins()}


def exists(name: str) -> bool:
    return name in BUILTIN or name in plugins()


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


def get_provider(name: str) -> Any:
    """An instance of the provider ``name`` (a ``cloudtrain.providers.base.Provider``; typed there, in
    ``cloudtrain.providers.get_provider``: the registry sits below the providers)."""
    decl = declaration(name)
    missing = [m for m in decl.requires if not _installed(m)]
    if missing:
        what = f"'{decl.distribution}[{decl.extra}]'" if decl.extra else decl.distribution
        raise ProviderNotInstalled(f"provider {name!r} needs {', '.join(missing)}, which is not installed",
                                   field="--provider", remedy=f"pip install {what}")
    cls = decl.load("provider")
    return cls()


def node_contract(name: str) -> ModuleType:
    """A provider's node contract module, imported here (the planner's copy of what the bootstrap loads), checked
    to be one (its ``node`` role: detect, planned, emulate)."""
    decl = declaration(name)
    found: ModuleType = decl.checked("node", importlib.import_module(decl.node_module()), decl.node_module())
    return found
