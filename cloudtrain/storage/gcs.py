"""gs:// objects through google-cloud-storage (Application Default Credentials; STORAGE_EMULATOR_HOST for tests)."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cloudtrain.storage.transfer import chunked, range_header, total_size

TIMEOUT = 60  # seconds to connect, and between two reads: the client's own default


class GCSStore:
    def __init__(self) -> None:
        from google.cloud import storage as gcs

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            self.client = gcs.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "local"),
                                     credentials=AnonymousCredentials())
        else:
            self.client = gcs.Client()

    def _blob(self, uri: str) -> Any:
        parsed = urlparse(uri)
        return self.client.bucket(parsed.netloc).blob(parsed.path.lstrip("/"))

    def exists(self, uri: str) -> bool:
        return bool(self._blob(uri).exists())

    def read_bytes(self, uri: str) -> bytes:
        return bytes(self._blob(uri).download_as_bytes())

    def write_bytes(self, uri: str, data: bytes) -> None:
        self._blob(uri).upload_from_string(data)

    def put_file(self, source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int:
        self._blob(uri).upload_from_filename(str(source))  # resumable for large files; an object appears whole
        size = source.stat().st_size
        if progress:  # the client reports no progress of its own: all at once
            progress(size)
        return size

    def get_file(self, uri: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        self._blob(uri).download_to_filename(str(tmp))
        os.replace(tmp, target)

    def read_stream(self, uri: str, start: int = 0, end: int | None = None) -> tuple[int, Iterator[bytes]]:
        """One GET of the object's media through the client's own authorised session, read in 1 MiB pieces: the
        client's download loop reads 8 KiB at a time and checksums them, which costs more CPU than the transfer
        (cloudtrain verifies sha256 itself)."""
        from google.api_core.exceptions import from_http_response

        blob = self._blob(uri)
        span = range_header(start, end)
        url = f"{self.client.api_endpoint}/download/storage/v1{blob.path}?alt=media"
        reply = self.client._http.get(url, headers={"Range": span} if span else {}, stream=True, timeout=TIMEOUT)
        if reply.status_code >= 400:
            reply.close()
            raise from_http_response(reply)
        size = total_size(reply.headers.get("Content-Range"), reply.headers.get("Content-Length"))
        return size, chunked(lambda n: reply.raw.read(n, decode_content=False), reply.close)

    def list(self, prefix: str) -> builtins.list[str]:
        parsed = urlparse(prefix)
        key = parsed.path.lstrip("/").rstrip("/")
        blobs = self.client.list_blobs(parsed.netloc, prefix=f"{key}/" if key else None)
        return sorted(f"gs://{parsed.netloc}/{b.name}" for b in blobs)

    def delete(self, uris: builtins.list[str]) -> None:
        from google.api_core.exceptions import NotFound

        for uri in uris:
            try:
                self._blob(uri).delete()
            except NotFound:
                continue
