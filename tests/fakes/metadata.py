"""A fake instance metadata server on 127.0.0.1 with the three platforms' spot notice endpoints, as their docs
describe them, strict about what the real ones require:

- EC2 IMDSv2: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600) returns a token;
  ``GET /latest/meta-data/spot/instance-action`` needs ``X-aws-ec2-metadata-token`` (401 without a valid one) and is
  404 until a reclaim is scheduled, then ``{"action": "terminate", "time": ...}``.
- Azure Scheduled Events: ``GET /metadata/scheduledevents?api-version=...`` needs ``Metadata: true`` (400 without)
  and an api-version; ``{"DocumentIncarnation": n, "Events": [...]}`` with a ``Preempt`` event once announced.
- GCE: ``GET /computeMetadata/v1/instance/preempted`` needs ``Metadata-Flavor: Google`` (403 without); ``FALSE``,
  then ``TRUE``.

``announce(after=s)`` makes the notice appear ``s`` seconds later; ``requests`` records what was asked.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class MetadataFake:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.tokens: set[str] = set()
        self.notice_at: float | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_PUT(self) -> None:
                fake.requests.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self.reply(400, "bad token request")
                token = f"token-{len(fake.tokens)}"
                fake.tokens.add(token)
                return self.reply(200, token)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                url = urlsplit(self.path)
                announced = fake.notice_at is not None and time.time() >= fake.notice_at
                if url.path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                        return self.reply(401, "")
                    if not announced:
                        return self.reply(404, "Not Found")
                    return self.reply(200, json.dumps({"action": "terminate", "time": "2026-01-01T00:02:00Z"}))
                if url.path == "/metadata/scheduledevents":
                    if self.headers.get("Metadata") != "true" or not parse_qs(url.query).get("api-version"):
                        return self.reply(400, json.dumps({"error": "Bad request"}))
                    events = [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt",
                               "ResourceType": "VirtualMachine", "Resources": ["node-0"], "EventStatus": "Scheduled",
                               "NotBefore": "Thu, 01 Jan 2026 00:00:30 GMT", "Description": "",
                               "EventSource": "Platform", "DurationInSeconds": -1}] if announced else []
                    return self.reply(200, json.dumps({"DocumentIncarnation": 2 if announced else 1,
                                                       "Events": events}))
                if url.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self.reply(403, "Missing Metadata-Flavor:Google header.")
                    return self.reply(200, "TRUE" if announced else "FALSE", {"Metadata-Flavor": "Google"})
                return self.reply(404, "Not Found")

            def reply(self, code: int, body: str, headers: dict[str, str] | None = None) -> None:
                data = body.encode()
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="metadata-fake", daemon=True).start()

    def announce(self, after: float = 0.0) -> None:
        self.notice_at = time.time() + after

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
