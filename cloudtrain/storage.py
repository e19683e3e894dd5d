"""A small object-storage layer over ``str`` URIs: file://, s3:// (more schemes plug in behind ``store_for``).

Native clients rather than fsspec: S3 uploads go through boto3's TransferManager (multipart, concurrent parts),
which is the throughput baseline anyway, and we avoid the s3fs/aiobotocore botocore pin. Every write is atomic: an
object is absent or complete (temp file + rename on file://; S3 PUTs are atomic).
"""

from __future__ import annotations

import builtins
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar
from urllib.parse import unquote, urlparse

from cloudtrain.errors import CloudtrainError, UserError

T = TypeVar("T")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])


class Store(Protocol):
    def exists(self, uri: str) -> bool: ...
    def read_bytes(self, uri: str) -> bytes: ...
    def write_bytes(self, uri: str, data: bytes) -> None: ...
    def put_file(self, source: Path, uri: str) -> int: ...
    def get_file(self, uri: str, target: Path) -> None: ...
    def list(self, prefix: str) -> builtins.list[str]: ...  # every object URI under prefix, recursively
    def delete(self, uris: builtins.list[str]) -> None: ...


def local_path(uri: str) -> Path:
    """The local path behind a ``file://`` URI (or a plain path)."""
    if "://" not in uri:
        return Path(uri)
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise UserError(f"{uri!r} is not a file:// URI")
    if parsed.netloc not in ("", "localhost"):
        raise UserError(f"{uri!r} names a host; file URIs must be file:///absolute/path",
                        remedy="write three slashes: file:///path/to/dir")
    return Path(unquote(parsed.path))


def _atomic_write(target: Path, writer: Callable[[BinaryIO], object]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            writer(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalStore:
    def exists(self, uri: str) -> bool:
        return local_path(uri).exists()

    def read_bytes(self, uri: str) -> bytes:
        return local_path(uri).read_bytes()

    def write_bytes(self, uri: str, data: bytes) -> None:
        _atomic_write(local_path(uri), lambda out: out.write(data))

    def put_file(self, source: Path, uri: str) -> int:
        def copy(out: BinaryIO) -> None:
            with open(source, "rb") as src:
                shutil.copyfileobj(src, out, 1024 * 1024)

        _atomic_write(local_path(uri), copy)
        return source.stat().st_size

    def get_file(self, uri: str, target: Path) -> None:
        def copy(out: BinaryIO) -> None:
            with open(local_path(uri), "rb") as src:
                shutil.copyfileobj(src, out, 1024 * 1024)

        _atomic_write(target, copy)

    def list(self, prefix: str) -> builtins.list[str]:
        root = local_path(prefix)
        if not root.is_dir():
            return []
        base = prefix.rstrip("/")
        return sorted(f"{base}/{p.relative_to(root).as_posix()}" for p in root.rglob("*")
                      if p.is_file() and not p.name.endswith(".part"))

    def delete(self, uris: builtins.list[str]) -> None:
        for uri in uris:
            path = local_path(uri)
            path.unlink(missing_ok=True)
            for parent in list(path.parents)[:2]:  # object stores have no folders: leave no empty ones behind
                try:
                    parent.rmdir()
                except OSError:
                    break


class S3Store:
    """boto3 with the standard credential chain; AWS_ENDPOINT_URL(_S3) points it at an emulator."""

    def __init__(self) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.client = boto3.client("s3")
        self.transfer = TransferConfig(multipart_threshold=16 * 1024 * 1024, multipart_chunksize=16 * 1024 * 1024,
                                       max_concurrency=8)

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        parsed = urlparse(uri)
        return parsed.netloc, parsed.path.lstrip("/")

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = self._split(uri)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = self._split(uri)
        return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def put_file(self, source: Path, uri: str) -> int:
        bucket, key = self._split(uri)
        self.client.upload_file(str(source), bucket, key, Config=self.transfer)
        return source.stat().st_size

    def get_file(self, uri: str, target: Path) -> None:
        bucket, key = self._split(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        self.client.download_file(bucket, key, str(tmp), Config=self.transfer)
        os.replace(tmp, target)

    def list(self, prefix: str) -> builtins.list[str]:
        bucket, key = self._split(prefix)
        key = key.rstrip("/") + "/" if key else ""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            out += [f"s3://{bucket}/{obj['Key']}" for obj in page.get("Contents", [])]
        return sorted(out)

    def delete(self, uris: builtins.list[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for uri in uris:
            bucket, key = self._split(uri)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})


_STORES: dict[str, tuple[Callable[[], Store], str]] = {
    "file": (LocalStore, ""),
    "s3": (S3Store, "aws"),
}


@cache
def _store(scheme: str) -> Store:
    factory, extra = _STORES[scheme]
    try:
        return factory()
    except ImportError as exc:
        raise UserError(f"{scheme}:// storage needs {exc.name}, which is not installed",
                        remedy=f"pip install 'cloudtrain[{extra}]'") from None


def store_for(uri: str) -> Store:
    scheme = uri.split("://", 1)[0] if "://" in uri else "file"
    if scheme not in _STORES:
        raise UserError(f"{uri!r}: the {scheme}:// store is not supported by this version of cloudtrain",
                        remedy="use one of: " + ", ".join(f"{s}://" for s in _STORES))
    return _store(scheme)


def with_retries(action: Callable[[], T], what: str, attempts: int = 5, base_delay: float = 0.5,
                 log: Callable[[str], None] | None = None) -> T:
    """Run ``action``, retrying with exponential backoff and full jitter; raise CloudtrainError after ``attempts``."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:  # every failure is retried; the last one is reported
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


def put_file(source: Path, uri: str) -> int:
    return store_for(uri).put_file(source, uri)
