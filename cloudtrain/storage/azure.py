"""Azure Blob objects through azure-storage-blob.

URIs: ``az://<container>/<path>`` (account from AZURE_STORAGE_ACCOUNT_NAME or the connection string) or
``abfs[s]://<container>@<account>.dfs.core.windows.net/<path>``. Credentials: AZURE_STORAGE_CONNECTION_STRING
(Azurite in tests) or DefaultAzureCredential.
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cloudtrain.errors import UserError
from cloudtrain.storage.transfer import chunked, delete_each, range_header, total_size

COPY_WAIT = 900.0  # seconds a server-side copy may stay pending (within one account it is done at once or soon)


class AzureBlobStore:
    # one GET of a large blob runs slower than several ranged GETs of it at once (Azurite here: 1.28x the SDK's own
    # concurrent download with 8 segments from the start, 0.95x with one stream split later; benchmarks/transfer.py)
    ranges_from_start = True

    def __init__(self) -> None:
        self._services: dict[str | None, Any] = {}

    def _service(self, account: str | None) -> Any:
        if account not in self._services:
            from azure.storage.blob import BlobServiceClient, ExponentialRetry

            # the SDK's default first retry waits ~15 s: too long inside a preemption grace period; cloudtrain's own
            # with_retries backs off around these quicker client retries
            policy = ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=3)
            # where the SDK's own downloader runs (get_file, read_bytes; restores use read_stream): each ranged GET
            # after the first 32 MiB costs a request and per-chunk work, and 16 MiB chunks (4 MiB by default) halve
            # its client CPU per byte
            options: dict[str, Any] = {"retry_policy": policy, "max_chunk_get_size": 16 * 1024 * 1024}
            conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
            if conn and (account is None or f"AccountName={account};" in conn + ";"):
                self._services[account] = BlobServiceClient.from_connection_string(conn, **options)
            else:
                name = account or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
                if not name:
                    raise UserError("az:// URIs need a storage account",
                                    remedy="set AZURE_STORAGE_ACCOUNT_NAME, or use abfs://container@account.dfs"
                                    ".core.windows.net/path")
                from azure.identity import DefaultAzureCredential

                self._services[account] = BlobServiceClient(f"https://{name}.blob.core.windows.net",
                                                            credential=DefaultAzureCredential(), **options)
        return self._services[account]

    def _split(self, uri: str) -> tuple[str | None, str, str]:
        parsed = urlparse(uri)
        if parsed.scheme in ("abfs", "abfss"):
            container, _, host = parsed.netloc.partition("@")
            return host.split(".", 1)[0] or None, container, parsed.path.lstrip("/")
        return None, parsed.netloc, parsed.path.lstrip("/")

    def _blob(self, uri: str) -> Any:
        account, container, key = self._split(uri)
        return self._service(account).get_blob_client(container, key)

    def exists(self, uri: str) -> bool:
        return bool(self._blob(uri).exists())

    def read_bytes(self, uri: str) -> bytes:
        return bytes(self._blob(uri).download_blob().readall())

    def write_bytes(self, uri: str, data: bytes) -> None:
        self._blob(uri).upload_blob(data, overwrite=True)

    def put_file(self, source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int:
        sent = [0]

        def hook(current: int, _total: int | None) -> None:  # the SDK reports a running total; we pass on deltas
            if progress and current > sent[0]:
                progress(current - sent[0])
                sent[0] = current

        with open(source, "rb") as data:  # block blob: committed whole at the end, never visible half-written
            self._blob(uri).upload_blob(data, overwrite=True, max_concurrency=8, progress_hook=hook)
        return source.stat().st_size

    def copy(self, source: str, uri: str) -> int:
        """Copy Blob from the source's URL (within one account the destination's own credential authorises the
        source, a connection string's key or an Entra ID token alike), waited for where the service copies it
        later (large blobs): the bytes stay in Azure."""
        target = self._blob(uri)
        copied = target.start_copy_from_url(self._blob(source).url)
        status, delay, deadline = copied.get("copy_status"), 0.05, time.monotonic() + COPY_WAIT
        while status == "pending" and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            status = target.get_blob_properties().copy.status
        if status == "pending":  # never left half-copied: the caller's retry starts it again
            target.abort_copy(copied["copy_id"])
        if status != "success":
            raise OSError(f"copying {source} to {uri} ended {status}")
        return int(target.get_blob_properties().size)

    def get_file(self, uri: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        with open(tmp, "wb") as out:
            self._blob(uri).download_blob(max_concurrency=8).readinto(out)
        os.replace(tmp, target)

    def read_stream(self, uri: str, start: int = 0, end: int | None = None) -> tuple[int, Iterator[bytes]]:
        """One GET of the blob (or of [start, end)) through the SDK's own request and pipeline (signing, retries of
        the request itself, error mapping), its body read in 1 MiB pieces as it arrives: the SDK's downloader
        fetches a series of ranged GETs instead and joins each in memory before handing it on, which cost more
        client CPU than the transfer (cloudtrain verifies sha256 itself)."""
        reply = self._blob(uri)._client.blob.download(  # the generated operation; cls keeps the body unread
            range=range_header(start, end), cls=lambda response, _body, _headers: response.http_response)
        size = total_size(reply.headers.get("Content-Range"), reply.headers.get("Content-Length"))
        raw = reply.internal_response.raw  # the requests transport's urllib3 response: the SDK's default transport
        return size, chunked(lambda n: raw.read(n, decode_content=False), reply.close)

    def list(self, prefix: str) -> builtins.list[str]:
        account, container, key = self._split(prefix)
        key = key.rstrip("/")
        client = self._service(account).get_container_client(container)
        base = prefix.rstrip("/")
        names = client.list_blobs(name_starts_with=f"{key}/" if key else None)
        return sorted(f"{base}/{b.name[len(key) + 1:] if key else b.name}" for b in names)

    def delete(self, uris: builtins.list[str]) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        delete_each(uris, lambda uri: self._blob(uri).delete_blob(), ResourceNotFoundError)
