"""s3:// objects through boto3 (standard credential chain; AWS_ENDPOINT_URL_S3 points it at an emulator)."""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cloudtrain.storage.transfer import chunked, range_header, total_size


class S3Store:
    """boto3 with the standard credential chain; AWS_ENDPOINT_URL(_S3) points it at an emulator. A store plugin for
    another S3-compatible service subclasses it with its own ``scheme`` and ``client_options()`` (its endpoint)."""

    scheme = "s3"

    def client_options(self) -> dict[str, Any]:
        """Extra arguments of ``boto3.client("s3", ...)``: none for AWS itself."""
        return {}

    def __init__(self) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        # Downloads are verified by sha256 against the manifest, so botocore's own CRC of each reply is a second pass
        # over the same bytes: asked for only where cloudtrain has no sha256 (read_bytes). Connections: several
        # transfers at once, each in parts (cloudtrain.storage.transfer).
        self.client = boto3.client("s3", config=Config(response_checksum_validation="when_required",
                                                       max_pool_connections=32), **self.client_options())
        self.transfer = TransferConfig(multipart_threshold=16 * 1024 * 1024, multipart_chunksize=16 * 1024 * 1024,
                                       max_concurrency=10)  # the SDK default: parts in flight, all files together
        self._manager: Any = None
        self._manager_pid = 0
        self._lock = threading.Lock()

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
        return bytes(self.client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")["Body"].read())

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def _uploads(self) -> Any:
        """One TransferManager for every upload of this store: files uploaded at once (storage.transfer.upload_many)
        share its pool of part uploads, as the SDK's best upload of many files does, instead of each ``upload_file``
        starting a manager and a pool of its own (8 files x 8 threads on a 2-core machine: 0.74x the SDK's best)."""
        with self._lock:
            if self._manager is None or self._manager_pid != os.getpid():  # a forked child has none of its threads
                from boto3.s3.transfer import create_transfer_manager

                self._manager, self._manager_pid = create_transfer_manager(self.client, self.transfer), os.getpid()
            return self._manager

    def put_file(self, source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int:
        from boto3.s3.transfer import ProgressCallbackInvoker

        bucket, key = self._split(uri)
        subscribers = [ProgressCallbackInvoker(progress)] if progress else None
        self._uploads().upload(str(source), bucket, key, subscribers=subscribers).result()
        return source.stat().st_size

    def copy(self, source: str, uri: str) -> int:
        """CopyObject (UploadPartCopy in 16 MiB parts above the multipart threshold) through the uploads' shared
        TransferManager: the bytes stay in S3."""
        source_bucket, source_key = self._split(source)
        bucket, key = self._split(uri)
        self._uploads().copy({"Bucket": source_bucket, "Key": source_key}, bucket, key).result()
        return int(self.client.head_object(Bucket=bucket, Key=key)["ContentLength"])

    def get_file(self, uri: str, target: Path) -> None:
        bucket, key = self._split(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        self.client.download_file(bucket, key, str(tmp), Config=self.transfer)
        os.replace(tmp, target)

    def read_stream(self, uri: str, start: int = 0, end: int | None = None) -> tuple[int, Iterator[bytes]]:
        bucket, key = self._split(uri)
        span = range_header(start, end)
        reply = self.client.get_object(Bucket=bucket, Key=key, **({"Range": span} if span else {}))
        body = reply["Body"]
        return total_size(reply.get("ContentRange"), reply.get("ContentLength")), chunked(body.read, body.close)

    def list(self, prefix: str) -> builtins.list[str]:
        bucket, key = self._split(prefix)
        key = key.rstrip("/") + "/" if key else ""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            out += [f"{self.scheme}://{bucket}/{obj['Key']}" for obj in page.get("Contents", [])]
        return sorted(out)

    def delete(self, uris: builtins.list[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for uri in uris:
            bucket, key = self._split(uri)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), 1000):
                reply = self.client.delete_objects(Bucket=bucket,
                                                   Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
                if reply.get("Errors"):  # a batch delete answers 200 even when keys failed: say so
                    first = reply["Errors"][0]
                    raise OSError(f"deleting {len(reply['Errors'])} object(s) in {self.scheme}://{bucket} failed: "
                                  f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}")
