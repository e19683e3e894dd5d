"""Write a deterministic tar.gz fast: fixed headers (mtime 0, owner root, no names), deflate in a second thread.

The bytes are exactly those ``tarfile`` writes in PAX format for the same members (``tests/test_packaging.py``
compares them), so the format and the digests are unchanged; the common header (a short ASCII name, a size under
8 GiB) is built here directly, about 10x faster than tarfile's generic path, which leaves room in the bundling time
for the secret scan. Other names fall back to tarfile's own header code.
"""

from __future__ import annotations

import hashlib
import queue
import struct
import tarfile
import threading
import zlib
from typing import BinaryIO, Protocol

# Level 1: the bundle is uploaded once and read once; level 6 costs ~2x the CPU for a few % smaller bundles.
GZIP_LEVEL = 1
_BLOCK = tarfile.BLOCKSIZE
_READ = 1 << 20


class Reader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def _tarfile_header(name: str, size: int, mode: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = size, mode, 0, 0, 0, "", ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


# This Python's tarfile header for such a file, around its name (0-100), mode (100-108), size (124-136) and
# checksum (148-156): whatever this tarfile writes there (device fields differ between versions) is kept.
_TEMPLATE = _tarfile_header("x", 0, 0o644)


def header(name: str, size: int, mode: int) -> bytes:
    """The tar header block(s) for a regular file, byte for byte what tarfile writes in PAX format."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > 100 or not raw.isascii() or size >= 8**11:  # tarfile adds a pax header: let it
        return _tarfile_header(name, size, mode)
    block = (raw.ljust(100, b"\x00") + b"%07o\x00" % (mode & 0o7777) + _TEMPLATE[108:124] + b"%011o\x00" % size
             + _TEMPLATE[136:148] + b" " * 8 + _TEMPLATE[156:_BLOCK])
    return block[:148] + b"%06o\x00" % sum(block) + block[155:]


class GzipPipe:
    """A write-only stream that gzips, hashes and writes in a second thread.

    tar framing and file reads stay on the caller's thread while deflate (which releases the GIL) runs on another
    core, the way `tar | gzip` splits the work. The gzip header is fixed (no name, mtime 0, OS 255) so the bytes
    are the same on every machine.
    """

    _CHUNK = 1 << 20

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._buffer = bytearray()
        self.written = 0  # uncompressed bytes
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._sha = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="cloudtrain-gzip", daemon=True)
        self._emit(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")
        self._thread.start()

    def _emit(self, data: bytes) -> None:
        self._out.write(data)
        self._sha.update(data)

    def _drain(self) -> None:
        deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        crc = size = 0
        try:
            while (chunk := self._queue.get()) is not None:
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
                self._emit(deflate.compress(chunk))
            self._emit(deflate.flush() + struct.pack("<II", crc, size & 0xFFFFFFFF))
        except BaseException as exc:  # surfaced on the writer's thread by close()
            self._error = exc
            while self._queue.get() is not None:
                pass

    def write(self, data: bytes) -> int:
        self.written += len(data)
        self._buffer += data
        if len(self._buffer) >= self._CHUNK:
            self._queue.put(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def close(self) -> str:
        """Flush everything; return the sha256 hex digest of the gzip bytes."""
        if self._buffer:
            self._queue.put(bytes(self._buffer))
            self._buffer.clear()
        self._queue.put(None)
        self._thread.join()
        if self._error:
            raise self._error
        return self._sha.hexdigest()


def add_file(out: GzipPipe, name: str, size: int, mode: int, data: Reader) -> None:
    """One regular file: header, ``size`` bytes read from ``data``, padding to the block size."""
    out.write(header(name, size, mode))
    left = size
    while left:
        chunk = data.read(min(left, _READ))
        if not chunk:
            raise OSError(f"{name} shrank while it was being packaged")
        out.write(chunk)
        left -= len(chunk)
    if size % _BLOCK:
        out.write(b"\x00" * (_BLOCK - size % _BLOCK))


def finish(out: GzipPipe) -> None:
    """The end-of-archive blocks and record padding tarfile writes on close."""
    out.write(b"\x00" * (2 * _BLOCK))
    if out.written % tarfile.RECORDSIZE:
        out.write(b"\x00" * (tarfile.RECORDSIZE - out.written % tarfile.RECORDSIZE))
