"""A small local HTTP fake of the Azure ML workspace APIs the real MLClient calls (ARM jobs and code assets,
workspace discovery, run history), with code uploads going to a real Azurite blob service through SAS URIs.

The provider's transport sends every ``https://<host>/<path>`` request here as ``/<host>/<path>``; the fake answers
what the service answers (as the SDK's own REST client expects it) and lets the test play the platform: move a job
through its statuses, fail it with a PreemptionError, write its user logs; ``lose_next_job_reply`` stores the
next job and answers 503, as a create whose reply was lost, so the SDK's retry puts it again.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

ACCOUNT = "devstoreaccount1"  # Azurite's well-known development account
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "azureml-blobstore"
PREEMPTED = "AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Reason: Received " \
            "pre-emption warning signal"


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class AzureMLFake:
    def __init__(self, azurite_port: int) -> None:
        from azure.storage.blob import BlobServiceClient

        self.blob_base = f"http://127.0.0.1:{azurite_port}/{ACCOUNT}"
        service = BlobServiceClient(self.blob_base, credential={"account_name": ACCOUNT, "account_key": KEY})
        self.container = service.get_container_client(CONTAINER)
        if not self.container.exists():
            self.container.create_container()
        self.codes: dict[str, dict[str, Any]] = {}  # "name/version" -> code version resource
        self.jobs: dict[str, dict[str, Any]] = {}  # name -> job resource (as PUT), plus our status
        self.errors: dict[str, str] = {}  # name -> run error message
        self.requests: list[str] = []
        self.uploads = 0  # startPendingUpload calls: how often a code folder had to be uploaded
        self.lose_next_job_reply = False  # the next job PUT is stored, but answered 503: the client retries
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _serve(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"null") if size else None
                status, reply = fake.handle(self.command, self.path, body)
                data = b"" if reply is None else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 202:
                    self.send_header("Location", f"http://127.0.0.1:{fake.port}/management.azure.com/done")
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _serve

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the platform's part ----------------------------------------------------------------------------
    def set_status(self, name: str, status: str, error: str = "") -> None:
        with self._lock:
            self.jobs[name]["properties"]["status"] = status
            if error:
                self.errors[name] = error

    def write_log(self, name: str, node: int, text: str) -> None:
        """Append to a node's user log, where the run history's SAS URL points."""
        blob = self.container.get_blob_client(f"ExperimentRun/dcid.{name}/user_logs/std_log_process_{node}.txt")
        if not blob.exists():
            blob.create_append_blob()
        blob.append_block(text.encode())

    # -- requests ---------------------------------------------------------------------------------------
    def _sas(self, blob_path: str) -> str:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        token = generate_container_sas(ACCOUNT, CONTAINER, account_key=KEY,
                                       permission=ContainerSasPermissions(read=True, write=True, list=True,
                                                                          create=True, add=True),
                                       expiry=datetime.now(timezone.utc) + timedelta(hours=1))
        return f"{self.blob_base}/{CONTAINER}/{blob_path}?{token}"

    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, Any]:
        parsed = urlparse(raw_path)
        host, _, path = parsed.path.lstrip("/").partition("/")
        query = parse_qs(parsed.query)
        with self._lock:
            self.requests.append(f"{method} {host}/{path}")
        if host == "discovery.fake":
            api = "https://api.fake"
            return 200, {"api": api, "history": api, "experimentation": api, "catalog": api}
        ws = re.match(r"subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.MachineLearningServices/"
                      r"workspaces/([^/]+)(.*)", path)
        if host == "management.azure.com" and ws:
            return self._arm(method, ws.group(4), body, query, "/" + path.split("?")[0])
        run = re.search(r"/runs/([^/]+)/details$", path)
        if host == "api.fake" and run:
            return self._run_details(run.group(1))
        return 404, {"error": {"code": "NotFound", "message": f"fake: no route for {method} {host}/{path}"}}

    def _arm(self, method: str, rest: str, body: Any, query: dict[str, list[str]], full: str) -> tuple[int, Any]:
        if rest == "":
            return 200, {"id": full, "name": full.rsplit("/", 1)[1], "location": "eastus",
                         "properties": {"discoveryUrl": "https://discovery.fake/discovery", "workspaceId": "ws-id",
                                        "mlFlowTrackingUri": ""}}
        code = re.fullmatch(r"/codes/([^/]+)/versions(?:/([^/]+))?(/startPendingUpload)?", rest)
        if code:
            name, version, pending = code.groups()
            if method == "GET" and version is None:  # "does an asset with this content hash exist?"
                wanted = (query.get("hash") or [None])[0]
                found = [c for c in self.codes.values()
                         if c["properties"].get("properties", {}).get("hash_sha256") == wanted and wanted]
                return 200, {"value": found}
            if pending:
                self.uploads += 1
                prefix = f"LocalUpload/{name}/{version}"
                return 200, {"blobReferenceForConsumption": {
                    "blobUri": f"{self.blob_base}/{CONTAINER}/{prefix}",
                    "credential": {"credentialType": "SAS", "sasUri": self._sas(prefix)}},
                    "pendingUploadId": f"{name}-{version}", "pendingUploadType": "TemporaryBlobReference"}
            key = f"{name}/{version}"
            if method == "PUT":
                self.codes[key] = {**body, "id": full, "name": version, "type": "Microsoft.MachineLearningServices/"
                                   "workspaces/codes/versions"}
                return 200, self.codes[key]
            return (200, self.codes[key]) if key in self.codes else (404, {"error": {"code": "NotFound"}})
        job = re.fullmatch(r"/jobs(?:/([^/]+))?(/cancel)?", rest)
        if job:
            name, cancel = job.groups()
            if name is None:
                return 200, {"value": list(self.jobs.values())}
            if cancel:
                if name in self.jobs and self.jobs[name]["properties"]["status"] not in ("Completed", "Failed",
                                                                                        "Canceled"):
                    self.set_status(name, "CancelRequested")
                return 202, None
            if method == "PUT":
                resource = {**body, "id": full, "name": name,
                            "type": "Microsoft.MachineLearningServices/workspaces/jobs",
                            "systemData": {"createdAt": datetime.now(timezone.utc).isoformat()}}
                resource["properties"]["status"] = "Starting"
                with self._lock:
                    self.jobs[name] = resource
                    lost, self.lose_next_job_reply = self.lose_next_job_reply, False
                if lost:  # the job exists; the answer the client gets says the service was unavailable
                    return 503, {"error": {"code": "ServiceUnavailable", "message": "try again"}}
                return 201, resource
            if name not in self.jobs:
                return 404, {"error": {"code": "UserError", "message": f"job {name} not found"}}
            current = self.jobs[name]
            if method == "GET" and current["properties"]["status"] == "CancelRequested":
                reply = json.loads(json.dumps(current))
                self.set_status(name, "Canceled")  # the service completes a cancel a moment later
                return 200, reply
            return 200, current
        if rest.startswith("/environments") or rest.startswith("/computes"):
            return 404, {"error": {"code": "NotFound", "message": rest}}
        return 404, {"error": {"code": "NotFound", "message": f"fake: no ARM route {method} {rest}"}}

    def _run_details(self, name: str) -> tuple[int, Any]:
        job = self.jobs.get(name)
        if job is None:
            return 404, {"error": {"code": "NotFound", "message": name}}
        logs = {}
        for blob in self.container.list_blobs(name_starts_with=f"ExperimentRun/dcid.{name}/user_logs/"):
            logs[blob.name.split(f"dcid.{name}/", 1)[1]] = self._sas(blob.name)
        details: dict[str, Any] = {"runId": name, "status": job["properties"]["status"], "logFiles": logs,
                                   "startTimeUtc": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if name in self.errors:
            details["error"] = {"error": {"code": "UserError", "message": self.errors[name]}}
        return 200, details
