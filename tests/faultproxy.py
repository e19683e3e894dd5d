"""A fault-injecting HTTP/1.1 proxy in front of a storage emulator (moto S3, gcp-storage-emulator, Azurite).

Clients talk to the proxy as if it were the service; it reads one request at a time from each (keep-alive)
connection, forwards it on a fresh upstream connection and relays or spoils the response. A seeded plan decides
which requests get a fault, so a run is reproducible up to thread scheduling; the kinds rotate so that every
configured kind is hit once a few requests went by. Persistent rules (``fail_matching``) play an outage that outlasts
any retry budget.

Kinds: ``reset_before`` (RST before the request reaches the emulator), ``reset_mid`` (the emulator applied it, then
RST halfway through the response), ``http_500``, ``http_503`` (S3: SlowDown; Azure: ServerBusy), ``slow`` (delay),
``truncate`` (full Content-Length, half the body, then close; an empty-bodied response is cut inside its headers).
Only through ``fail_matching``: ``flip``, one bit of the reply's body inverted in transit, a reply no length check
notices; ``flip_request``, the same done to the request's body on its way to the emulator; ``cut_request``, the
connection dropped half-way through an upload: the emulator reads half the body (then end of file), the client an RST.
An emulator that drops a connection without answering gets a 502, as from a load balancer (in ``trace``, not counted).
"""

from __future__ import annotations

import random
import select
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from urllib.parse import unquote

KINDS = ("reset_before", "reset_mid", "http_500", "http_503", "slow", "truncate")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "expect"}
_REASONS = {403: "Forbidden", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class FaultPlan:
    rate: float = 0.2  # share of requests that get a fault
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    delay: float = 0.4  # seconds added by ``slow``


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    def mentions(self, text: str) -> bool:
        """The object name may sit in the path (S3, Azure), the query or the JSON metadata of the body (GCS)."""
        return text in unquote(self.target) or text.encode() in self.body[:65536]


@dataclass(eq=False)
class _Rule:
    predicate: Callable[[Request], bool]
    kind: str | tuple[str, ...]  # several: taken in turn, one per matching request
    times: int | None  # None: until removed
    turn: int = 0

    def next_kind(self) -> str:
        if isinstance(self.kind, str):
            return self.kind
        self.turn += 1
        return self.kind[(self.turn - 1) % len(self.kind)]


def _error_body(flavor: str, status: int) -> tuple[str, bytes, dict[str, str]]:
    """What the real service answers: (content type, body, extra headers)."""
    if flavor == "gs":
        reason = {403: "forbidden", 429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}[status]
        grpc = ', "status": "RESOURCE_EXHAUSTED"' if status == 429 else ""  # how Google APIs throttle
        body = (f'{{"error": {{"code": {status}, "message": "injected fault"{grpc}, '
                f'"errors": [{{"reason": "{reason}"}}]}}}}')
        return "application/json; charset=UTF-8", body.encode(), {}
    codes = ({403: "AccessDenied", 429: "SlowDown", 500: "InternalError", 503: "SlowDown"} if flavor == "s3" else
             {403: "AuthorizationFailure", 429: "ServerBusy", 500: "InternalError", 503: "ServerBusy"})
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{codes[status]}</Code>'
            f'<Message>injected fault</Message><RequestId>faultproxy</RequestId></Error>')
    extra = {"x-ms-error-code": codes[status]} if flavor == "az" else {}
    return "application/xml", body.encode(), extra


class _Stream:
    """Buffered reads off a socket; bodies are gathered as a list of chunks (MB-sized uploads pass through)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, bytearray()

    def read_until(self, marker: bytes, limit: int = 1 << 20) -> bytes | None:
        while (i := self.buf.find(marker)) < 0:
            if len(self.buf) > limit:
                raise ConnectionError("header block too long")
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        out = bytes(self.buf[:i + len(marker)])
        del self.buf[:i + len(marker)]
        return out

    def read_exact(self, n: int) -> bytes:
        parts = [bytes(self.buf[:n])]
        del self.buf[:n]
        n -= len(parts[0])
        while n > 0:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("peer closed mid-body")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def read_to_eof(self) -> bytes:
        parts = [bytes(self.buf)]
        self.buf.clear()
        while chunk := self.sock.recv(1 << 20):
            parts.append(chunk)
        return b"".join(parts)

    def read_chunked(self) -> bytes:
        """The raw chunked encoding, framing included (relayed as is)."""
        parts = []
        while True:
            line = self.read_until(b"\r\n")
            if line is None:
                raise ConnectionError("peer closed inside a chunked body")
            parts.append(line)
            size = int(line.split(b";")[0], 16)
            if size == 0:
                while (trailer := self.read_until(b"\r\n")) not in (b"\r\n", None):
                    parts.append(trailer)
                parts.append(b"\r\n")
                return b"".join(parts)
            parts.append(self.read_exact(size + 2))


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = [line.partition(":") for line in lines[1:] if line]
    return lines[0], [(name.strip(), value.strip()) for name, _, value in fields]


def _read_body(stream: _Stream, headers: dict[str, str], bodiless: bool) -> tuple[bytes, bool]:
    """(raw body, delimited by close)."""
    if bodiless:
        return b"", False
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return stream.read_chunked(), False
    if "content-length" in headers:
        return stream.read_exact(int(headers["content-length"])), False
    return stream.read_to_eof(), True


def _send_unless_answered(upstream: socket.socket, data: bytes) -> None:
    """Send a request, stopping early if the server already answered (gcp-storage-emulator sends 404 to a finished
    resumable session without reading the body, then closes): the answer is relayed, as a real proxy would."""
    view = memoryview(data)
    for start in range(0, len(view), 1 << 16):
        if select.select([upstream], [], [], 0)[0]:
            return
        try:
            upstream.sendall(view[start:start + (1 << 16)])
        except OSError:
            return  # whatever the server said before closing is still read; no answer at all fails the read


def _flipped(body: bytes) -> bytes:
    """``body`` with one bit of its middle byte inverted: the length stays right, the content does not."""
    middle = len(body) // 2
    return body[:middle] + bytes([body[middle] ^ 1]) + body[middle + 1:]


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), what a crashed load balancer or a dropped NAT entry looks like."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


class FaultProxy:
    """``FaultProxy(upstream_port, flavor="s3"|"gs"|"az", plan=FaultPlan(...))``; ``start()`` picks a free port."""

    def __init__(self, upstream_port: int, flavor: str, plan: FaultPlan | None = None) -> None:
        self.upstream_port, self.flavor = upstream_port, flavor
        self.plan = plan or FaultPlan()
        self.rate = self.plan.rate
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.journal: list[tuple[str, str, str]] = []  # (kind, method, target) of every fault, for failure messages
        self.trace: list[tuple[float, str, str, str]] = []  # (monotonic, method, target, status or fault kind)
        self.arrived: list[tuple[float, str, str]] = []  # (monotonic, method, target) of every request, as it came
        self._rng = random.Random(self.plan.seed)
        self._turn = 0
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._clients: set[socket.socket] = set()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with proxy._lock:
                    proxy._clients.add(self.request)
                try:
                    proxy._serve(self.request)
                except OSError:
                    pass  # the client went away, or we reset it
                finally:
                    with proxy._lock:
                        proxy._clients.discard(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in list(self._clients):  # idle keep-alive connections would otherwise hold their threads
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    @property
    def faults(self) -> int:
        return sum(self.injected.values())

    @contextmanager
    def calm(self) -> Iterator[None]:
        """No random faults inside the block (persistent rules still apply): to read back the ground truth."""
        with self._lock:
            saved, self.rate = self.rate, 0.0
        try:
            yield
        finally:
            with self._lock:
                self.rate = saved

    @contextmanager
    def fail_matching(self, predicate: Callable[[Request], bool], kind: str | tuple[str, ...] = "http_403",
                      times: int | None = None) -> Iterator[None]:
        """Matching requests fail with ``kind`` (``http_403``: a refusal no client retries) until the block ends,
        an outage longer than any retry budget; or only the first ``times`` of them."""
        rule = _Rule(predicate, kind, times)
        with self._lock:
            self._rules.append(rule)
        try:
            yield
        finally:
            with self._lock:
                self._rules.remove(rule)

    def _decide(self, request: Request) -> str | None:
        with self._lock:
            self.requests += 1
            self.arrived.append((time.monotonic(), request.method, request.target))
            for rule in self._rules:
                if rule.times != 0 and rule.predicate(request):
                    rule.times = None if rule.times is None else rule.times - 1
                    return rule.next_kind()
            if self.rate <= 0 or self._rng.random() >= self.rate:  # calm periods leave the seeded sequence alone
                return None
            kind = self.plan.kinds[self._turn % len(self.plan.kinds)]
            self._turn += 1
            return kind

    def _count(self, kind: str, request: Request) -> None:
        with self._lock:
            self.injected[kind] += 1
            self.journal.append((kind, request.method, request.target))
            self.trace.append((time.monotonic(), request.method, request.target, kind))

    def _traced(self, request: Request, status_line: str) -> None:
        with self._lock:
            self.trace.append((time.monotonic(), request.method, request.target, status_line.split(" ", 2)[1]))

    def _serve(self, sock: socket.socket) -> None:
        client = _Stream(sock)
        while True:
            head = client.read_until(b"\r\n\r\n")
            if head is None:
                return
            start, header_list = _parse_head(head)
            method, target, version = start.split(" ", 2)
            headers = {k.lower(): v for k, v in header_list}
            if headers.get("expect", "").lower() == "100-continue":
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # we read the body ourselves, then decide
            body, _ = _read_body(client, headers,
                                 bodiless="content-length" not in headers and "transfer-encoding" not in headers)
            request = Request(method, target, headers, body)
            keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            kind = self._decide(request)

            if kind == "reset_before":
                self._count(kind, request)
                _reset(sock)
                return
            if kind is not None and kind.startswith("http_"):
                self._count(kind, request)
                self._answer_error(sock, int(kind[5:]), method)
                continue

            if kind == "flip_request" and body:
                self._count(kind, request)
                body = _flipped(body)
            if kind == "cut_request":
                self._count(kind, request)
                with suppress(OSError):  # whatever the emulator answers to half a body, the client never sees it
                    self._forward(method, target, header_list, body[:len(body) // 2], cut=True)
                _reset(sock)
                return
            try:
                status_line, reply_headers, reply_body, close_delimited = self._forward(method, target, header_list,
                                                                                        body)
            except OSError as exc:  # not a planned fault: answer as a load balancer would, and keep a trace
                with self._lock:
                    self.trace.append((time.monotonic(), method, target, f"502 ({exc})"))
                sock.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            if kind == "slow":
                self._count(kind, request)
                time.sleep(self.plan.delay)
            if kind == "flip" and reply_body:
                self._count(kind, request)
                reply_body = _flipped(reply_body)
            keep = keep_alive and not close_delimited
            lines = [status_line] + [f"{k}: {v}" for k, v in reply_headers if k.lower() not in _HOP_BY_HOP]
            if not keep:
                lines.append("Connection: close")
            reply_head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            if kind in ("reset_mid", "truncate"):
                self._count(kind, request)
                # half the body after full headers; with no body to cut, half the headers
                sock.sendall(reply_head + reply_body[:len(reply_body) // 2] if reply_body
                             else reply_head[:len(reply_head) // 2])
                if kind == "reset_mid":
                    _reset(sock)
                else:
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                return
            sock.sendall(reply_head + reply_body)
            self._traced(request, status_line)
            if not keep:
                return

    def _forward(self, method: str, target: str, header_list: list[tuple[str, str]], body: bytes,
                 cut: bool = False) -> tuple[str, list[tuple[str, str]], bytes, bool]:
        """One request on a fresh upstream connection (``Connection: close``), response read whole. With ``cut``,
        ``body`` is less than the headers announce and the request ends (write side closed) after it."""
        lines = [f"{method} {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in header_list
                                                   if k.lower() not in _HOP_BY_HOP]
        lines.append("Connection: close")
        with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=120) as upstream:
            _send_unless_answered(upstream, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            if cut:
                upstream.shutdown(socket.SHUT_WR)
            stream = _Stream(upstream)
            while True:
                head = stream.read_until(b"\r\n\r\n")
                if head is None:
                    raise ConnectionError("the emulator closed without answering")
                status_line, reply_headers = _parse_head(head)
                status = int(status_line.split(" ", 2)[1])
                if status >= 200:  # a stray 1xx is swallowed: we answered 100-continue ourselves
                    break
            names = {k.lower(): v for k, v in reply_headers}
            reply_body, close_delimited = _read_body(stream, names,
                                                     bodiless=method == "HEAD" or status in (204, 304))
        return status_line, reply_headers, reply_body, close_delimited

    def _answer_error(self, sock: socket.socket, status: int, method: str) -> None:
        content_type, body, extra = _error_body(self.flavor, status)
        if method == "HEAD":
            body = b""
        lines = [f"HTTP/1.1 {status} {_REASONS[status]}", f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in extra.items())]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
