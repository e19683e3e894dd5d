"""A local HTTP fake of the two Google APIs the Vertex provider calls: Vertex AI customJobs (v1 REST) and Cloud
Logging entries:list (v2 REST).

The provider's real clients (aiplatform_v1's JobServiceClient with the REST transport, google-auth's
AuthorizedSession) send every request; the fake answers at the HTTP boundary, as the service would:
- create parses the body with aiplatform_v1.CustomJob's own JSON parser, unknown fields refused (400), assigns a
  numeric id and starts the job QUEUED; get, list (label filters, pages) and :cancel (CANCELLING, then CANCELLED);
- the job's state follows what the test sets (``set_state``), or a script of states per created job that advances
  one step on each read (``scripts``), so a waiting client sees the job move; "PREEMPTED" in a script ends the job
  FAILED with the error Vertex gives when spot capacity is reclaimed;
- ``write_log`` adds Cloud Logging entries (resource ml_job, task_name label) that entries:list returns, filtered
  by job id and timestamp, in pages;
- any path under /expired answers 401 UNAUTHENTICATED, as for a caller whose token has expired, and /token refuses
  to refresh it (invalid_grant), as Google's token endpoint does for a revoked refresh token;
- ``lose_next_create_reply`` creates the job but answers too late, so the client times out.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from google.cloud.aiplatform_v1 import CustomJob

TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
            "JOB_STATE_PARTIALLY_SUCCEEDED"}
PREEMPTED_ERROR = {"code": 14, "message": "The replica workerpool0-0 was preempted: its Spot VM was reclaimed."}
_JOB_PATH = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/customJobs(?:/(\d+))?(:cancel)?$")


def now(at: float | None = None) -> str:
    """A time as Vertex writes it (RFC 3339, UTC): ``at`` (epoch seconds), default now."""
    when = datetime.now(timezone.utc) if at is None else datetime.fromtimestamp(at, timezone.utc)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a held reply (lose_next_create_reply) closed its socket: expected


class VertexFake:
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}  # id -> the CustomJob as the service holds it (REST JSON)
        self.received: dict[str, dict[str, Any]] = {}  # id -> the create body as the client sent it
        self.calls: list[str] = []
        self.cancel_requests: list[str] = []
        self.scripts: list[list[str]] = []  # state scripts handed to the next created jobs, in order
        self.lose_next_create_reply = 0.0
        self._steps: dict[str, list[str]] = {}
        self._logs: dict[str, list[dict[str, Any]]] = {}
        self._ids = itertools.count(4000000000000000001)
        self._lock = threading.RLock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlparse(self.path)
                if url.path.startswith("/expired"):
                    status, reply = fake.error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                                                                       "credentials: the access token has expired.")
                else:
                    status, reply, delay = fake.handle(method, url.path, parse_qs(url.query), body)
                    time.sleep(delay)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the platform's part, driven by the test --------------------------------------------------------
    def set_state(self, job_id: str, state: str, error: dict[str, Any] | None = None, at: float | None = None) -> None:
        """The job moves to ``state`` at ``at`` (epoch seconds; default now): its updateTime, and its startTime
        (the first run) or endTime, as Vertex dates them."""
        with self._lock:
            job = self.jobs[job_id]
            if state == "PREEMPTED":
                state, error = "JOB_STATE_FAILED", PREEMPTED_ERROR
            job["state"], job["updateTime"] = state, now(at)
            if state == "JOB_STATE_RUNNING":
                job.setdefault("startTime", now(at))
            if state in TERMINAL:
                job["endTime"] = now(at)
            if error:
                job["error"] = error

    def write_log(self, job_id: str, task: str, lines: list[str]) -> None:
        """What Vertex does with a replica's stdout: one Cloud Logging entry per line."""
        with self._lock:
            entries = self._logs.setdefault(job_id, [])
            for line in lines:
                entries.append({"insertId": f"{len(entries):08d}", "timestamp": now(), "textPayload": line,
                                "resource": {"type": "ml_job", "labels": {"job_id": job_id, "task_name": task}}})

    # -- requests -------------------------------------------------------------------------------------
    @staticmethod
    def error(code: int, status: str, message: str) -> tuple[int, dict[str, Any]]:
        return code, {"error": {"code": code, "status": status, "message": message}}

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: bytes) -> tuple[int, dict[str, Any], float]:
        if path == "/token":  # Google's OAuth token endpoint, for a refresh token that was revoked
            return 400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."}, 0.0
        if path == "/v2/entries:list" and method == "POST":
            return 200, self._entries(json.loads(body or b"{}")), 0.0
        match = _JOB_PATH.match(path)
        if not match:
            return (*self.error(404, "NOT_FOUND", f"no route {method} {path}"), 0.0)
        parent, job_id, cancel = match.groups()
        with self._lock:
            if job_id is None and method == "POST":
                self.calls.append("create")
                return self._create(parent, body)
            if job_id is None:
                self.calls.append("list")
                return (200, self._list(parent, query), 0.0)
            job = self.jobs.get(job_id)
            if job is None or not job["name"].startswith(parent + "/"):
                return (*self.error(404, "NOT_FOUND", f"The CustomJob does not exist: {parent}/customJobs/"
                                                      f"{job_id}"), 0.0)
            if cancel:
                self.calls.append("cancel")
                self.cancel_requests.append(job_id)
                if job["state"] not in TERMINAL:
                    self.set_state(job_id, "JOB_STATE_CANCELLING")
                return 200, {}, 0.0
            self.calls.append("get")
            self._advance(job_id)
            return 200, json.loads(json.dumps(job)), 0.0

    def _create(self, parent: str, body: bytes) -> tuple[int, dict[str, Any], float]:
        try:  # the service's own parser, unknown fields refused
            parsed = CustomJob.from_json(body.decode(), ignore_unknown_fields=False)
        except Exception as exc:
            return (*self.error(400, "INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}"), 0.0)
        if not parsed.display_name or not parsed.job_spec.worker_pool_specs:
            return (*self.error(400, "INVALID_ARGUMENT", "display_name and job_spec.worker_pool_specs are "
                                                         "required"), 0.0)
        job_id = str(next(self._ids))
        job = json.loads(CustomJob.to_json(parsed, use_integers_for_enums=False))
        job |= {"name": f"{parent}/customJobs/{job_id}", "state": "JOB_STATE_QUEUED", "createTime": now(),
                "updateTime": now()}
        self.jobs[job_id] = job
        self.received[job_id] = json.loads(body)
        if self.scripts:
            self._steps[job_id] = list(self.scripts.pop(0))
        delay, self.lose_next_create_reply = self.lose_next_create_reply, 0.0
        return 200, json.loads(json.dumps(job)), delay

    def _advance(self, job_id: str) -> None:
        job = self.jobs[job_id]
        if job["state"] == "JOB_STATE_CANCELLING":  # the service stops the job a moment after it is asked to
            self.set_state(job_id, "JOB_STATE_CANCELLED")
        elif self._steps.get(job_id) and job["state"] not in TERMINAL:
            self.set_state(job_id, self._steps[job_id].pop(0))

    def _list(self, parent: str, query: dict[str, list[str]]) -> dict[str, Any]:
        wanted = re.findall(r'labels\.([\w-]+)\s*=\s*"([^"]*)"', (query.get("filter") or [""])[0])
        found = [j for j in self.jobs.values() if j["name"].startswith(parent + "/") and
                 all((j.get("labels") or {}).get(k) == v for k, v in wanted)]
        found.sort(key=lambda j: j["createTime"], reverse=True)
        size = int((query.get("pageSize") or ["50"])[0])
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        page: dict[str, Any] = {"customJobs": json.loads(json.dumps(found[start:start + size]))}
        if start + size < len(found):
            page["nextPageToken"] = str(start + size)
        return page

    def _entries(self, request: dict[str, Any]) -> dict[str, Any]:
        query = request.get("filter", "")
        job = re.search(r'resource\.labels\.job_id\s*=\s*"(\d+)"', query)
        since = re.search(r'timestamp\s*>=\s*"([^"]+)"', query)
        with self._lock:
            entries = [e for e in self._logs.get(job.group(1) if job else "", [])
                       if not since or e["timestamp"] >= since.group(1)]
        size = int(request.get("pageSize") or 50)
        start = int(request.get("pageToken") or 0)
        page: dict[str, Any] = {"entries": entries[start:start + size]}
        if start + size < len(entries):
            page["nextPageToken"] = str(start + size)
        return page
