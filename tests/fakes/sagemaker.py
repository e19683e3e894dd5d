"""A thin HTTP front for moto's SageMaker: forwards every call to moto and plays the parts moto lacks.

moto creates, describes, lists, searches and tags training jobs, but keeps every job "Completed" from the start,
has no StopTrainingJob, and lets a second CreateTrainingJob with the same name overwrite the first. The front, at the
HTTP boundary (the real boto3 signs and serialises every request), adds what the service does:
- a job's status follows what the test sets (the platform's part: starting, training, interrupted ...), each
  transition dated when it was set (or at the time the test gives);
- StopTrainingJob moves a job to Stopping, then Stopped;
- a second create of an existing name is refused, as SageMaker refuses it;
- ``lose_next_create_reply`` creates the job but answers too late, so the client times out and retries.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a held reply (lose_next_create_reply) closed its socket: expected


class SageMakerFront:
    def __init__(self, moto_port: int) -> None:
        self.moto_port = moto_port
        self.states: dict[str, list[tuple[str, str]]] = {}  # job -> status history (newest last)
        self.since: dict[str, list[float]] = {}  # job -> when each status of the history began (its StartTime)
        self.calls: list[str] = []
        self.received: dict[str, dict[str, Any]] = {}  # job -> the CreateTrainingJob request as the service got it
        self.stop_requests: list[str] = []
        self.lose_next_create_reply = 0.0  # seconds to hold the reply of the next create
        self.refuse_creates: list[tuple[str, str]] = []  # (error code, message) answered to the next creates
        self._lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = (self.headers.get("X-Amz-Target") or "").rpartition(".")[2]
                if self.path.startswith("/expired"):  # an endpoint whose every caller holds an expired token
                    status, headers, reply = front._error("ExpiredTokenException",
                                                          "The security token included in the request is expired")
                else:
                    status, headers, reply = front.handle(target, body, dict(self.headers))
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the platform's part, driven by the test --------------------------------------------------------
    def set_status(self, job: str, primary: str, secondary: str, at: float | None = None) -> None:
        """The job moves to (primary, secondary), at ``at`` (epoch seconds; default now): the transition's
        StartTime in SecondaryStatusTransitions, as SageMaker dates it."""
        with self._lock:
            self.states.setdefault(job, []).append((primary, secondary))
            self.since.setdefault(job, []).append(time.time() if at is None else at)

    def status(self, job: str) -> tuple[str, str] | None:
        with self._lock:
            history = self.states.get(job)
            return history[-1] if history else None

    # -- requests -------------------------------------------------------------------------------------
    def _forward(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.moto_port, timeout=30)
        headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        conn.request("POST", "/", body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, dict(response.getheaders()), data

    @staticmethod
    def _error(kind: str, message: str) -> tuple[int, dict[str, str], bytes]:
        return 400, {"Content-Type": "application/x-amz-json-1.1"}, \
            json.dumps({"__type": kind, "message": message}).encode()

    def handle(self, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        request = json.loads(body or b"{}")
        name = request.get("TrainingJobName", "")
        with self._lock:
            self.calls.append(target)
        if target == "CreateTrainingJob":
            if self.refuse_creates:  # as SageMaker refuses for quota (ResourceLimitExceeded) or capacity
                return self._error(*self.refuse_creates.pop(0))
            if self.status(name) is not None:
                return self._error("ValidationException", "Training job names must be unique within an AWS "
                                                          f"account and region, and a training job with this name "
                                                          f"already exists ({name})")
            reply = self._forward(body, headers)
            if reply[0] == 200:
                self.received[name] = request
                self.set_status(name, "InProgress", "Starting")
                delay, self.lose_next_create_reply = self.lose_next_create_reply, 0.0
                time.sleep(delay)  # the job exists; the client has given up on this answer
            return reply
        if target == "StopTrainingJob":
            current = self.status(name)
            if current is None:
                return self._error("ValidationException", f"Could not find job to update with name {name}")
            with self._lock:
                self.stop_requests.append(name)
            if current[0] in ("InProgress",):
                self.set_status(name, "Stopping", "Stopping")
            return 200, {"Content-Type": "application/x-amz-json-1.1"}, b"{}"
        status, reply_headers, reply = self._forward(body, headers)
        if target == "DescribeTrainingJob" and status == 200:
            reply = self._overlay(name, json.loads(reply))
        elif target == "Search" and status == 200:
            found = json.loads(reply)
            for result in found.get("Results", []):
                job = result.get("TrainingJob", {})
                self._overlay_fields(job.get("TrainingJobName", ""), job)
            reply = json.dumps(found).encode()
        return status, reply_headers, reply

    def _overlay_fields(self, name: str, job: dict[str, Any]) -> None:
        history = self.states.get(name)
        if not history:
            return
        primary, secondary = history[-1]
        job["TrainingJobStatus"], job["SecondaryStatus"] = primary, secondary
        job["SecondaryStatusTransitions"] = [{"Status": s, "StartTime": at}
                                             for (_, s), at in zip(history, self.since[name], strict=True)]
        if primary == "InProgress":
            job.pop("TrainingEndTime", None)

    def _overlay(self, name: str, job: dict[str, Any]) -> bytes:
        self._overlay_fields(name, job)
        current = self.status(name)
        if current and current[0] == "Stopping":  # the service stops the job a moment after it is asked to
            self.set_status(name, "Stopped", "Stopped")
        return json.dumps(job).encode()
