"""A small object-storage layer over ``str`` URIs: file://, s3://, gs://, az:// (and abfs://), and any scheme a
store plugin registers in the ``cloudtrain.stores`` entry-point group (``r2 = mypkg:R2Store``: a class with the
``Store`` methods below, made with no arguments; ``INSTALL``, a class attribute, says how to install what it needs;
``cloudtrain.testing.stores.StoreConformance`` is the suite it passes).

Native clients rather than fsspec: S3 uploads go through boto3's TransferManager (multipart, concurrent parts),
which is the throughput baseline anyway, and we avoid the s3fs/aiobotocore botocore pin. Every write is atomic: an
object is absent or complete (temp file + rename on file://; S3 PUTs are atomic).
"""

from __future__ import annotations

import builtins
import errno
import importlib
import random
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Protocol, TypeVar

from cloudtrain.errors import CloudtrainError, UserError
from cloudtrain.storage.local import local_path

__all__ = ["Store", "exists", "join", "local_path", "put_file", "read_bytes", "schemes", "store_for", "with_retries",
           "write_bytes"]

T = TypeVar("T")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])


class Store(Protocol):
    def exists(self, uri: str) -> bool: ...
    def read_bytes(self, uri: str) -> bytes: ...
    def write_bytes(self, uri: str, data: bytes) -> None: ...
    def put_file(self, source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int: ...
    def get_file(self, uri: str, target: Path) -> None: ...
    # The object's size, and its bytes [start, end) (to its end if ``end`` is None) in chunks of about 1 MiB: one
    # streamed request (cloudtrain.storage.transfer); closing the iterator early ends it.
    def read_stream(self, uri: str, start: int = 0, end: int | None = None) -> tuple[int, Iterator[bytes]]: ...
    def list(self, prefix: str) -> builtins.list[str]: ...  # every object URI under prefix, recursively
    def delete(self, uris: builtins.list[str]) -> None: ...
    # Optional, where the service copies an object itself (S3 CopyObject, GCS rewrite, Azure Copy Blob, a hard link
    # on file://): ``copy(source_uri, uri) -> size of the copy``, both in this store. Node 0 then takes the other
    # nodes' checkpoint files into a checkpoint without their bytes passing through it (``copier``).


def copier(uri: str) -> Callable[[str, str], int] | None:
    """The store's own object copy for ``uri``'s store, or None where it has none (a plugin without ``copy``)."""
    copy = getattr(store_for(uri), "copy", None)
    return copy if callable(copy) else None


# scheme -> ("module:Class", the extra that installs its client). Imported only when a URI of that scheme is used.
_STORES: dict[str, tuple[str, str]] = {
    "file": ("cloudtrain.storage.local:LocalStore", ""),
    "s3": ("cloudtrain.storage.s3:S3Store", "aws"),
    "gs": ("cloudtrain.storage.gcs:GCSStore", "gcp"),
    "az": ("cloudtrain.storage.azure:AzureBlobStore", "azure"),
    "abfs": ("cloudtrain.storage.azure:AzureBlobStore", "azure"),
    "abfss": ("cloudtrain.storage.azure:AzureBlobStore", "azure"),
}


STORE_GROUP = "cloudtrain.stores"  # a store plugin's entry points: scheme = "module:Class"


def plugin_stores() -> dict[str, str]:
    """The schemes store plugins add (never replacing a built-in one): scheme -> "module:Class"."""
    import sys

    from cloudtrain.entry_points import scan

    return {name: entry.value for name, entry in scan(tuple(sys.path), STORE_GROUP).items() if name not in _STORES}


def schemes() -> list[str]:
    """Every scheme a URI may use here: the built-in ones, then the plugins'."""
    return [*_STORES, *sorted(plugin_stores())]


@lru_cache(maxsize=None)  # not functools.cache: nodes may run Python 3.8
def _store(scheme: str) -> Store:
    target, extra = _STORES[scheme] if scheme in _STORES else (plugin_stores()[scheme], "")
    module, _, name = target.partition(":")
    try:
        kind = getattr(importlib.import_module(module), name)
        store: Store = kind()
        return store
    except ImportError as exc:
        hint = f"pip install 'cloudtrain[{extra}]'" if extra else \
            f"install what the {scheme}:// store plugin ({target}) needs: {exc}"
        raise UserError(f"{scheme}:// storage needs {exc.name}, which is not installed", remedy=hint) from None
    except AttributeError:
        raise UserError(f"the {scheme}:// store plugin names {target}, which does not exist",
                        remedy=f"check the [{STORE_GROUP}] entry point of the package that provides it") from None


def store_for(uri: str) -> Store:
    scheme = uri.split("://", 1)[0] if "://" in uri else "file"
    if scheme not in _STORES and scheme not in plugin_stores():
        raise UserError(f"{uri!r}: the {scheme}:// store is not supported by this version of cloudtrain",
                        remedy="use one of: " + ", ".join(f"{s}://" for s in schemes())
                        + f", or install a store plugin that registers {scheme} in [{STORE_GROUP}]")
    return _store(scheme)


def with_retries(action: Callable[[], T], what: str, attempts: int = 5, base_delay: float = 0.5,
                 log: Callable[[str], None] | None = None) -> T:
    """Run ``action``, retrying with exponential backoff and full jitter; raise CloudtrainError after ``attempts``."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:  # every failure is retried (but a full disk's); the last one is reported
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # stays full: said at once
                where = f" holding {Path(exc.filename).parent}" if exc.filename else ""
                raise CloudtrainError(f"{what} failed: no space left on the disk{where}",
                                      remedy="free space on that disk, or store on one with room") from exc
            if attempt == attempts:
                raise CloudtrainError(f"{what} failed after {attempts} attempts: {exc}",
                                      remedy="check the storage URI, credentials and network") from exc
            delay = random.uniform(0, base_delay * 2 ** (attempt - 1))
            if log:
                log(f"{what} failed ({exc}); retry {attempt}/{attempts - 1} in {delay:.1f}s")
            time.sleep(delay)
    raise AssertionError("unreachable")


# Module-level conveniences used across cloudtrain.
def exists(uri: str) -> bool:
    return store_for(uri).exists(uri)


def read_bytes(uri: str) -> bytes:
    return store_for(uri).read_bytes(uri)


def write_bytes(uri: str, data: bytes) -> None:
    store_for(uri).write_bytes(uri, data)


def put_file(source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int:
    """Upload a file; ``progress`` is called with each number of bytes sent (from other threads on S3)."""
    return store_for(uri).put_file(source, uri, progress)
