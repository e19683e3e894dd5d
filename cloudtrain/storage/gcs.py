"""gs:// objects through google-cloud-storage (Application Default Credentials; STORAGE_EMULATOR_HOST for tests).

Uploads speak the JSON API through the client's own authorised session rather than ``upload_from_filename``: a
file up to ``SINGLE_REQUEST_MAX`` goes in one simple (media) request, a larger one as ONE streamed PUT of a
resumable session, resumed from the offset the service reports after a failure. The client instead reads a small
file whole into a multipart body and sends a large one in 100 MiB chunks, each read into memory first; Google's
own guidance is to send a resumable upload in one request unless the data must be chunked. Either way the bytes
are read once, checksummed (crc32c) on the way out and compared with the object the service created.
"""

from __future__ import annotations

import base64
import builtins
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from cloudtrain.storage.transfer import chunked, delete_each, range_header, total_size

TIMEOUT = 60  # seconds to connect, and between two reads: the client's own default
SINGLE_REQUEST_MAX = 8 * 1024 * 1024  # the client's own switch from one request to a resumable session
PROGRESS_STEP = 1 << 20  # bytes between two progress reports


class _CutShort(ConnectionError):
    """A request or its reply ended early without HTTP noticing: a 308 (incomplete) to a PUT that carried every
    remaining byte, or a session's start answered with no whole session URI (a reply cut inside its headers).
    Retried like a dropped connection."""


class _Checksum:
    """crc32c of the file's prefix sent so far, and the progress reported for it. A resumed request re-reads bytes
    already counted; only bytes past the prefix are counted, so the sum and the progress cover each byte once."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        import google_crc32c

        self.crc, self.done, self.progress, self._unreported = google_crc32c.Checksum(), 0, progress, 0

    def saw(self, position: int, data: bytes) -> None:
        new = data[self.done - position:] if position < self.done else data
        if not new:
            return
        self.crc.update(new)
        self.done += len(new)
        self._unreported += len(new)
        if self.progress and self._unreported >= PROGRESS_STEP:
            self.progress(self._unreported)
            self._unreported = 0

    def finish(self) -> str:
        if self.progress and self._unreported:
            self.progress(self._unreported)
            self._unreported = 0
        return base64.b64encode(self.crc.digest()).decode("ascii")


class _FileBody:
    """A file's bytes from ``start`` to ``size`` as a streamed request body, in the pieces the HTTP client reads."""

    def __init__(self, file: IO[bytes], start: int, size: int, checksum: _Checksum) -> None:
        file.seek(start)
        self.file, self.position, self.size, self.checksum = file, start, size, checksum

    def __len__(self) -> int:  # requests sends it as the Content-Length
        return self.size - self.position

    def read(self, n: int = -1) -> bytes:
        data = self.file.read(min(n, len(self)) if n >= 0 else len(self))
        self.checksum.saw(self.position, data)
        self.position += len(data)
        return data


class GCSStore:
    def __init__(self) -> None:
        from google.cloud import storage as gcs

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            self.client = gcs.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "local"),
                                     credentials=AnonymousCredentials())
        else:
            self.client = gcs.Client()

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        parsed = urlparse(uri)
        return parsed.netloc, parsed.path.lstrip("/")

    def _blob(self, uri: str) -> Any:
        bucket, name = self._split(uri)
        return self.client.bucket(bucket).blob(name)

    def exists(self, uri: str) -> bool:
        return bool(self._blob(uri).exists())

    def read_bytes(self, uri: str) -> bytes:
        return bytes(self._blob(uri).download_as_bytes())

    def write_bytes(self, uri: str, data: bytes) -> None:
        self._upload(io.BytesIO(data), uri, len(data))

    def put_file(self, source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int:
        with open(source, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            self._upload(file, uri, size, progress)
        return size

    def _upload(self, file: IO[bytes], uri: str, size: int, progress: Callable[[int], None] | None = None) -> None:
        """An object appears whole or not at all (a resumable session creates it with its last byte)."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        if size == 0:  # some emulators take an empty simple upload for one without a body
            self._blob(uri).upload_from_string(b"")
            return
        checksum = _Checksum(progress)
        if size <= SINGLE_REQUEST_MAX:
            created = DEFAULT_RETRY(lambda: self._simple_upload(file, uri, size, checksum))()
        else:
            created = self._resumable_upload(file, uri, size, checksum, DEFAULT_RETRY)
        sent = checksum.finish()
        if created.get("crc32c", sent) != sent:
            raise OSError(f"{uri}: the stored object's crc32c {created['crc32c']} is not the {sent} of the bytes "
                          "sent (spoilt in transit, or the file changed while it was read)")

    def _request(self, method: str, url: str, *, ok: tuple[int, ...] = (200, 201), **kwargs: Any) -> Any:
        from google.api_core.exceptions import from_http_response

        reply = self.client._http.request(method, url, timeout=TIMEOUT, allow_redirects=False, **kwargs)
        if reply.status_code not in ok:
            error = from_http_response(reply)  # reads the (small) error body, even of a streamed reply
            reply.close()
            raise error
        return reply

    def _upload_url(self, uri: str) -> tuple[str, str]:
        """The JSON API's upload URL for ``uri``'s bucket, and the object's name."""
        bucket, name = self._split(uri)
        return f"{self.client.api_endpoint}/upload/storage/v1/b/{bucket}/o", name

    def _simple_upload(self, file: IO[bytes], uri: str, size: int, checksum: _Checksum) -> dict[str, Any]:
        url, name = self._upload_url(uri)
        reply = self._request("POST", url, data=_FileBody(file, 0, size, checksum),
                              params={"uploadType": "media", "name": name},
                              headers={"Content-Type": "application/octet-stream"})
        return dict(reply.json())

    def _resumable_upload(self, file: IO[bytes], uri: str, size: int, checksum: _Checksum,
                          retry: Any) -> dict[str, Any]:
        """Start a session, then send everything left in one PUT; after a failure, ask the session how much it
        has (``Range: bytes=0-N``; none without the header) and send the rest from there."""
        url, name = self._upload_url(uri)

        def start_session() -> str:
            reply = self._request("POST", url, params={"uploadType": "resumable"},
                                  json={"name": name}, headers={"X-Upload-Content-Type": "application/octet-stream",
                                                                "X-Upload-Content-Length": str(size)})
            session = str(reply.headers.get("Location", ""))
            if "upload_id=" not in session:
                raise _CutShort(f"{uri}: the upload session was started, but its URI did not arrive ({session!r})")
            return session

        session = retry(start_session)()
        attempts = 0

        def send_rest() -> dict[str, Any]:
            nonlocal attempts
            start, attempts = 0, attempts + 1
            if attempts > 1:
                status = self._request("PUT", session, ok=(200, 201, 308), data=b"",
                                       headers={"Content-Range": f"bytes */{size}"})
                if status.status_code != 308:
                    return dict(status.json())  # the last attempt got through; its answer did not
                have = status.headers.get("Range")
                start = int(have.rsplit("-", 1)[1]) + 1 if have else 0
            reply = self._request("PUT", session, ok=(200, 201, 308), data=_FileBody(file, start, size, checksum),
                                  headers={"Content-Range": f"bytes {start}-{size - 1}/{size}"})
            if reply.status_code == 308:
                raise _CutShort(f"{uri}: the upload session has {reply.headers.get('Range')} of {size} bytes")
            return dict(reply.json())

        created: dict[str, Any] = retry(send_rest)()
        return created

    def copy(self, source: str, uri: str) -> int:
        """objects.rewrite, called again with its token until it is done (one call within a location and storage
        class; large objects elsewhere take several): the bytes stay in GCS."""
        target, origin = self._blob(uri), self._blob(source)
        token, _done, total = target.rewrite(origin)
        while token is not None:
            token, _done, total = target.rewrite(origin, token=token)
        return int(total)

    def get_file(self, uri: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        self._blob(uri).download_to_filename(str(tmp))
        os.replace(tmp, target)

    def read_stream(self, uri: str, start: int = 0, end: int | None = None) -> tuple[int, Iterator[bytes]]:
        """One GET of the object's media through the client's own authorised session, read in 1 MiB pieces: the
        client's download loop reads 8 KiB at a time and checksums them, which costs more CPU than the transfer
        (cloudtrain verifies sha256 itself)."""
        span = range_header(start, end)
        url = f"{self.client.api_endpoint}/download/storage/v1{self._blob(uri).path}?alt=media"
        reply = self._request("GET", url, ok=(200, 206), headers={"Range": span} if span else {}, stream=True)
        size = total_size(reply.headers.get("Content-Range"), reply.headers.get("Content-Length"))
        return size, chunked(lambda n: reply.raw.read(n, decode_content=False), reply.close)

    def list(self, prefix: str) -> builtins.list[str]:
        bucket, key = self._split(prefix)
        key = key.rstrip("/")
        blobs = self.client.list_blobs(bucket, prefix=f"{key}/" if key else None)
        return sorted(f"gs://{bucket}/{b.name}" for b in blobs)

    def delete(self, uris: builtins.list[str]) -> None:
        from google.api_core.exceptions import NotFound

        delete_each(uris, lambda uri: self._blob(uri).delete(), NotFound)
