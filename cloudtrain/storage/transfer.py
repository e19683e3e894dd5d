"""Many objects between a store and local files at once: what a restore and a checkpoint upload run on.

Downloads (``download_many``): a pool of threads fetches the files largest first, each as ONE streamed request for
the whole object while there are files left to start (a ranged request costs the store a seek, and an emulator a
copy of the whole object). Once the queue is empty, an idle worker watches the streams still running and takes over
the second half of one that, at the pace it now runs alone, would need more than ``SPLIT_AFTER`` seconds more (a
ranged request for that half): one large file is then fetched by every worker at once on a real cloud, and not cut
up where a single stream is fast anyway. A store whose single stream is known to be slower than parallel ranges
(``ranges_from_start``: Azure Blob) has its large files cut into one segment per worker from the start instead, as
the SDK's own concurrent download does. A stream that fails resumes from the last byte written (a ranged request),
with backoff. Bytes are written in place (``pwrite``) and hashed in order beside the streams, by a few hashing
threads (one per file at a time): a chunk that continues the hashed prefix is hashed from memory, what was written
meanwhile (or arrived ahead of the prefix) from the page cache once the prefix reaches it. A stream never waits
for sha256, and each byte is hashed once.

Uploads (``upload_many``): a pool of threads uploads the files largest first (each store's client splits a large
file into concurrent parts itself) while other threads, one per core, hash them from the page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain import contract
from cloudtrain.errors import CloudtrainError

THREADS = 8  # streams at once per process: what the clients' connection pools are sized for
SPLIT_AFTER = 1.0  # seconds a stream would still need on its own before an idle worker takes half of it
WATCH_SECONDS = 0.25  # how long an idle worker measures the running streams' pace before it decides
MIN_SPLIT = 16 * 1024 * 1024  # a stream is split only if each half keeps at least this many bytes
UP_FRONT_SPLIT = 32 * 1024 * 1024  # the least bytes per segment of a file split before its download starts
HASH_READ = 4 * 1024 * 1024  # page-cache reads when hashing a range that arrived ahead of the prefix
ATTEMPTS = 5


def threads() -> int:
    return max(1, int(os.environ.get(contract.TRANSFER_THREADS) or THREADS))


@dataclass
class Fetched:
    """What was written for one object: its sha256 and size as written, and its size as the store reported it."""

    sha256: str
    size: int
    stored_size: int


@dataclass
class _Segment:
    start: int
    end: int  # exclusive; lowered when another worker takes over the rest
    pos: int  # [start, pos) is written
    reserved: int  # [pos, reserved) is being written now: the end never drops below it


@dataclass
class _File:
    uri: str
    path: Path
    size: int  # expected
    fd: int = -1
    segments: list[_Segment] = field(default_factory=list)
    hashed: int = 0
    hashing: bool = False
    hasher: Any = field(default_factory=hashlib.sha256)
    stored_size: int | None = None
    result: Fetched | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def frontier(self) -> int:
        """The end of the written prefix that starts at ``hashed`` (segments partition [0, size))."""
        at = self.hashed
        for seg in self.segments:
            if seg.start <= at < seg.end:
                if seg.pos < seg.end:
                    return seg.pos
                at = seg.end
        return at


class _Cancelled(Exception):
    pass


class _DiskError(Exception):
    """Writing or re-reading a local file failed (disk full, ...): fatal, not retried like a store's reply."""


def _split_up_front(f: _File, parts: int) -> list[_File | tuple[_File, _Segment]]:
    """``f`` as one task (one stream, split later only if it turns out slow), or, for a store whose single stream is
    slower than parallel ranges, as up to ``parts`` segments of at least UP_FRONT_SPLIT bytes fetched at once
    from the start (what the SDK's own concurrent download does) instead of one request after another."""
    count = min(parts, f.size // UP_FRONT_SPLIT)
    if count < 2:
        return [f]
    bounds = [f.size * i // count for i in range(count + 1)]
    f.segments = [_Segment(a, b, a, a) for a, b in zip(bounds, bounds[1:])]  # not pairwise: nodes run 3.8
    return [(f, seg) for seg in f.segments]


class _Downloads:
    def __init__(self, store: Any, files: list[_File], log: Callable[[str], None] | None, workers: int) -> None:
        self.store, self.log = store, log
        self.queue: list[_File | tuple[_File, _Segment]] = []
        parts = max(1, workers) if getattr(store, "ranges_from_start", False) else 1
        for f in sorted(files, key=lambda f: -f.size):
            self.queue += _split_up_front(f, parts)
        self.files = files
        self.lock = threading.Lock()
        self.active: list[tuple[_File, _Segment]] = []
        self.error: BaseException | None = None
        self.hashing = ThreadPoolExecutor(max(1, min(workers, os.cpu_count() or 1)),
                                          thread_name_prefix="cloudtrain-hash")

    # -- scheduling ----------------------------------------------------------------------------------------
    def worker(self) -> None:
        try:
            while self.error is None:
                task = self._next()
                if task is None:
                    return
                self._run(*task)
        except BaseException as exc:  # the first failure stops every worker; download_many raises it
            with self.lock:
                self.error = self.error or exc

    def _next(self) -> tuple[_File, _Segment] | None:
        while self.error is None:
            with self.lock:
                if self.queue:
                    task = self.queue.pop(0)
                    if isinstance(task, _File):
                        f, seg = task, _Segment(0, task.size, 0, 0)
                        with f.lock:
                            f.segments.append(seg)
                    else:
                        f, seg = task
                    self.active.append((f, seg))
                    return f, seg
                if not any(seg.end - max(seg.reserved, seg.pos) >= 2 * MIN_SPLIT for _, seg in self.active):
                    return None  # nothing left that could ever be worth splitting
                marks = {id(seg): (seg.pos, time.monotonic()) for _, seg in self.active}
            time.sleep(WATCH_SECONDS)  # measure each stream's pace now that no file is waiting to start
            with self.lock:
                stolen = self._split(marks)
                if stolen:
                    self.active.append(stolen)
                    return stolen
        return None

    def _split(self, marks: dict[int, tuple[int, float]]) -> tuple[_File, _Segment] | None:
        """The second half of the stream that would need longest on its own, if that is over SPLIT_AFTER. A stream
        that delivered nothing while it was watched is never split: halving it again would only queue one more
        ranged request behind the one the store has not answered yet (moto reads the whole object for each, so one
        1 GB file was fetched as dozens of ranges: 40 s against 3 s for the SDK's single GET)."""
        best, best_eta = None, SPLIT_AFTER
        now = time.monotonic()
        for f, seg in self.active:
            if id(seg) not in marks:
                continue
            since_pos, since = marks[id(seg)]
            with f.lock:
                left = seg.end - max(seg.reserved, seg.pos)
                pace = (seg.pos - since_pos) / max(now - since, 1e-3)
            if pace <= 0:  # not delivering yet (a ranged request the store is still preparing): pace unknown
                continue
            eta = left / pace
            if left >= 2 * MIN_SPLIT and eta > best_eta:
                best, best_eta = (f, seg), eta
        if best is None:
            return None
        f, seg = best
        with f.lock:
            left_from = max(seg.reserved, seg.pos)
            middle = left_from + (seg.end - left_from) // 2
            tail = _Segment(middle, seg.end, middle, middle)
            seg.end = middle
            f.segments.append(tail)
            f.segments.sort(key=lambda s: s.start)
        return f, tail

    # -- one stream ----------------------------------------------------------------------------------------
    def _run(self, f: _File, seg: _Segment) -> None:
        try:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    self._stream(f, seg)
                    return
                except _Cancelled:
                    return
                except _DiskError as exc:
                    raise exc.__cause__ or exc from None
                except Exception as exc:
                    if self.error is not None:
                        return
                    if attempt == ATTEMPTS:
                        raise CloudtrainError(f"download of {f.uri} failed after {ATTEMPTS} attempts: {exc}",
                                              remedy="check the storage URI, credentials and network") from exc
                    delay = random.uniform(0, 0.5 * 2 ** (attempt - 1))
                    if self.log:
                        self.log(f"download of {f.uri} failed ({exc}); resuming at byte {seg.pos}, retry "
                                 f"{attempt}/{ATTEMPTS - 1} in {delay:.1f}s")
                    time.sleep(delay)
        finally:
            with self.lock:
                self.active = [(g, s) for g, s in self.active if s is not seg]

    def _stream(self, f: _File, seg: _Segment) -> None:
        with f.lock:
            if seg.pos >= seg.end or f.result is not None:
                return
            whole = seg.start == 0 and seg.pos == 0 and seg.end == f.size  # nobody took a part of it yet
            start = seg.pos
        stored, chunks = self.store.read_stream(f.uri, start, None if whole else seg.end)
        try:
            with f.lock:
                f.stored_size = stored
            if stored != f.size:  # not the object the manifest describes: nothing more to fetch of it
                self._finish(f, mismatch=True)
                return
            for chunk in chunks:
                if self.error is not None:
                    raise _Cancelled
                if not self._write(f, seg, chunk):
                    return  # another worker took over the rest, or the segment is done
            if seg.pos < seg.end:  # the reply ended early without an error: resume from here
                raise OSError(f"the reply ended at byte {seg.pos} of {seg.end}")
        finally:
            close = getattr(chunks, "close", None)
            if close:
                close()

    def _write(self, f: _File, seg: _Segment, chunk: bytes) -> bool:
        with f.lock:
            at = seg.pos
            n = min(len(chunk), seg.end - at)
            seg.reserved = at + n
        data = memoryview(chunk)[:n]
        written = 0
        try:
            while written < n:
                written += os.pwrite(f.fd, data[written:], at + written)
        except OSError as exc:
            raise _DiskError from exc
        with f.lock:
            seg.pos = at + n
            take = not f.hashing  # nobody hashes this file now: a hashing thread takes it on from here
            if take:
                f.hashing = True
            inline = take and f.hashed == at
            done = seg.pos >= seg.end
        if take:
            self.hashing.submit(self._hash, f, data if inline else None)
        return not done

    def _hash(self, f: _File, data: memoryview | None) -> None:
        """In a hashing thread, as the one thread that hashes this file (``f.hashing``): ``data`` (the chunk that
        continues the hashed prefix, from memory), then whatever is written past the prefix by now (from the page
        cache), until the prefix reaches what is not written yet; then the role is given up. sha256 runs beside the
        streams, not in them: a stream's next read never waits for it (0.25 s of a 537 MB restore's 1.1 s)."""
        try:
            hashed = None
            if data is not None:
                f.hasher.update(data)
                hashed = f.hashed + len(data)
            while True:
                with f.lock:
                    if hashed is not None:
                        f.hashed = hashed
                    upto = min(f.frontier(), f.hashed + HASH_READ)
                    if upto <= f.hashed:
                        f.hashing = False
                        complete = f.hashed >= f.size
                        break
                    at = f.hashed
                try:
                    chunk = os.pread(f.fd, upto - at, at)
                except OSError as exc:
                    raise _DiskError from exc
                if not chunk:
                    raise _DiskError from OSError(f"{f.path} ends at byte {at}, before what was written to it")
                f.hasher.update(chunk)
                hashed = at + len(chunk)
            if complete:
                self._finish(f, mismatch=False)
        except BaseException as exc:  # a disk error is fatal: every stream stops and download_many raises it
            with self.lock:
                self.error = self.error or (exc.__cause__ or exc if isinstance(exc, _DiskError) else exc)

    def _finish(self, f: _File, mismatch: bool) -> None:
        with f.lock:
            if f.result is not None:
                return
            for seg in f.segments:
                seg.end = min(seg.end, max(seg.pos, seg.reserved))  # a mismatch stops the other streams too
            stored = f.stored_size if f.stored_size is not None else f.size
            f.result = Fetched(sha256="" if mismatch else f.hasher.hexdigest(), size=f.hashed, stored_size=stored)


def download_many(store: Any, items: list[tuple[str, Path, int]], log: Callable[[str], None] | None = None,
                  workers: int | None = None) -> list[Fetched]:
    """Download ``(uri, path, expected size)`` items into their paths (parent folders must exist); returns what
    was written for each, in order. An object whose stored size is not the expected one is not fetched on (its
    ``stored_size`` says so, its sha256 is empty). Raises CloudtrainError when a stream fails ``ATTEMPTS`` times."""
    files = [_File(uri, path, size) for uri, path, size in items]
    run: _Downloads | None = None
    try:
        for f in files:
            f.fd = os.open(f.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(f.fd, f.size)
            if f.size == 0:  # nothing to stream, but the object must exist and be empty
                f.segments.append(_Segment(0, 0, 0, 0))
        count = workers or threads()
        run = _Downloads(store, [f for f in files if f.size > 0], log, count)
        empty = [f for f in files if f.size == 0]
        for f in empty:
            stored, chunks = store.read_stream(f.uri, 0, None)
            getattr(chunks, "close", lambda: None)()
            f.stored_size = stored
            run._finish(f, mismatch=stored != 0)
        pool = [threading.Thread(target=run.worker, name=f"cloudtrain-download-{i}", daemon=True)
                for i in range(count)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        run.hashing.shutdown(wait=True)  # the files' last bytes may still be hashing
        if run.error is not None:
            if isinstance(run.error, CloudtrainError):
                raise run.error
            raise CloudtrainError(f"download failed: {run.error}") from run.error
    finally:
        if run is not None:
            run.hashing.shutdown(wait=True)  # before the files it reads are closed
        for f in files:
            if f.fd >= 0:
                os.close(f.fd)
    missing = [f.uri for f in files if f.result is None]
    if missing:
        raise CloudtrainError(f"download of {missing[0]} did not complete")
    return [f.result for f in files if f.result is not None]


COPY_CHUNK = 8 * 1024 * 1024  # a local copy's read size: hashed from memory as it passes


def _copy_hashed(source: Path, target: Path) -> Fetched:
    """Copy a local file, hashing each chunk from memory on its way (the source is read once)."""
    h, size = hashlib.sha256(), 0
    buffer = bytearray(COPY_CHUNK)
    view = memoryview(buffer)
    with open(source, "rb", buffering=0) as src, open(target, "wb", buffering=0) as out:
        stored = os.fstat(src.fileno()).st_size
        while True:
            n = src.readinto(buffer)
            if not n:
                break
            h.update(view[:n])
            written = 0
            while written < n:
                written += out.write(view[written:n]) or 0
            size += n
    return Fetched(sha256=h.hexdigest(), size=size, stored_size=stored)


def _linked_hashed(source: Path, target: Path) -> Fetched:
    """A hard link of a local file, hashed (read once); a copy where no link can be made."""
    try:
        os.link(source, target)
    except OSError:
        return _copy_hashed(source, target)
    size = target.stat().st_size
    return Fetched(sha256=sha256_of(target), size=size, stored_size=size)


def copy_many(items: list[tuple[Path, Path, int]], link: bool = False, workers: int | None = None) -> list[Fetched]:
    """Local files to local paths (a file:// store's objects), ``(source, target, expected size)``, several at once,
    each hashed as it is read: hard links with ``link`` (the target is never rewritten in place), else copies. A
    source whose size is not the expected one is not copied (its ``stored_size`` says so, its sha256 is empty).
    Returns what was written for each, in order; an OSError (a missing file, a full disk) stops them all."""
    def fetch(source: Path, target: Path, size: int) -> Fetched:
        stored = source.stat().st_size
        if stored != size:
            return Fetched(sha256="", size=0, stored_size=stored)
        return _linked_hashed(source, target) if link else _copy_hashed(source, target)

    count = max(1, min(workers or threads(), len(items) or 1))
    with ThreadPoolExecutor(count, thread_name_prefix="cloudtrain-copy") as pool:
        return list(pool.map(lambda item: fetch(*item), items))


def hash_many(paths: list[Path], workers: int | None = None) -> list[str]:
    """The sha256 of each local file, several at once (hashlib releases the GIL on large buffers)."""
    count = max(1, min(workers or threads(), len(paths) or 1, os.cpu_count() or 1))
    with ThreadPoolExecutor(count, thread_name_prefix="cloudtrain-hash") as pool:
        return list(pool.map(sha256_of, paths))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_READ):
            h.update(chunk)
    return h.hexdigest()


def upload_many(items: list[tuple[Path, str]], upload: Callable[[Path, str], int], hash_files: bool = False,
                workers: int | None = None) -> tuple[int, list[str]]:
    """Upload ``(path, uri)`` items through ``upload`` (which retries), several at once, largest first; with
    ``hash_files``, hashing threads (one per core, at most one per file) hash the files meanwhile (from the page
    cache: each was just written).
    Returns (bytes uploaded, the sha256 of each file, or '' without ``hash_files``)."""
    order = sorted(range(len(items)), key=lambda i: -items[i][0].stat().st_size)
    digests = [""] * len(items)
    count = workers or threads()
    # sha256 releases the GIL on large buffers: several files hash at once, one per core at most
    hashers = max(1, min(count, len(items), os.cpu_count() or 1))
    with ThreadPoolExecutor(count, thread_name_prefix="cloudtrain-upload") as pool, \
            ThreadPoolExecutor(hashers, thread_name_prefix="cloudtrain-hash") as hashing:
        hashed = {i: hashing.submit(sha256_of, items[i][0]) for i in order} if hash_files else {}
        sent = [pool.submit(upload, *items[i]) for i in order]
        total = sum(s.result() for s in sent)
        for i, future in hashed.items():
            digests[i] = future.result()
    return total, digests


def delete_each(uris: list[str], delete_one: Callable[[str], object], missing: type[BaseException],
                workers: int | None = None) -> None:
    """Delete each object with a request of its own (GCS's and Azure's stores), several at once. Retention removes
    a whole checkpoint after each publish, and the next save, or the final one at a SIGTERM, waits for it: one
    request after another took one round trip per file. An object already gone (``missing``) is fine; the first
    other error is raised once every request has ended, so nothing is left in flight."""
    def one(uri: str) -> None:
        with contextlib.suppress(missing):
            delete_one(uri)

    if len(uris) <= 1:  # a manifest, a marker: no thread for one request
        for uri in uris:
            one(uri)
        return
    with ThreadPoolExecutor(min(workers or threads(), len(uris)), thread_name_prefix="cloudtrain-delete") as pool:
        done = [pool.submit(one, uri) for uri in uris]
    for future in done:
        future.result()


def chunked(read: Callable[[int], bytes], close: Callable[[], object], limit: int | None = None,
            size: int = 1 << 20) -> Iterator[bytes]:
    """A reader's bytes in chunks of ``size`` (up to ``limit`` bytes), until it returns nothing; ``close`` runs
    when the chunks are exhausted or the consumer stops early (``close()`` on the generator)."""
    try:
        left = limit
        while left is None or left > 0:
            chunk = read(size if left is None else min(size, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk
    finally:
        close()


def total_size(content_range: str | None, content_length: int | str | None) -> int:
    """An object's size from a reply: the total in ``Content-Range: bytes a-b/TOTAL``, else the reply's length."""
    if content_range and "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    return int(content_length or 0)


def range_header(start: int, end: int | None) -> str | None:
    """The HTTP Range for [start, end) (``end`` None: to the object's end); None for the whole object."""
    if start == 0 and end is None:
        return None
    return f"bytes={start}-{'' if end is None else end - 1}"
