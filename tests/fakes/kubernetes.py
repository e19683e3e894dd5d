"""A small Kubernetes API server on 127.0.0.1 for the kubernetes provider's tests (no kube-apiserver installs here).

It holds objects in memory and answers the REST paths the official client calls: create/get/list (label and field
selectors)/delete/merge-patch of custom objects, watch (from a resourceVersion, until timeoutSeconds), ConfigMaps,
namespaces, PersistentVolumeClaims, pods and their logs, SelfSubjectAccessReview. Like the real server with the
Kubeflow CRDs installed, it refuses (422, Status with causes) what the vendored ``openAPIV3Schema`` refuses
(jsonschema, unknown fields refused as with fieldValidation=Strict), evaluates the CRDs' create-time CEL rules with
cel-python, and applies the Trainer's webhook (reserved PET_* env; the runtime must exist). ``lose_next_create_reply``
makes the next create happen and its answer never come (the connection closes). What a controller would do (pods,
conditions) the tests play through its helpers."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from cloudtrain.providers.kubernetes import schema as vendored
from cloudtrain.sdk import Job

PLURALS = {"trainjobs": "TrainJob", "pytorchjobs": "PyTorchJob", "clustertrainingruntimes": "ClusterTrainingRuntime"}
RUNTIME = Path(vendored.CRDS, "torch_distributed.yaml")


def _cel(kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    import celpy

    env, found = celpy.Environment(), []
    for path, rule in vendored.create_rules(kind):
        program = env.program(env.compile(rule["rule"]))
        for where, value in vendored.values_at(body, path):
            if not program.evaluate({"self": celpy.json_to_cel(value)}):
                found.append((where or "metadata.name", rule.get("message", rule["rule"])))
    return found


def _encode_secret(body: dict[str, Any]) -> None:
    """As the API server stores a Secret: stringData (write-only) merged into data, base64-encoded."""
    written = body.pop("stringData", None) or {}
    body["data"] = {**(body.get("data") or {}),
                    **{k: base64.b64encode(str(v).encode()).decode() for k, v in written.items()}}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _selected(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (labels or "").split(",")):
        key, _, value = term.partition("=")
        if have.get(key) != value:
            return False
    for term in filter(None, (fields or "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and obj["metadata"]["name"] != value:
            return False
    return True


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, namespace, name)
        self.logs: dict[tuple[str, str], str] = {}
        self.namespaces = {"default", "team"}
        self.claims = {("team", "shared"), ("default", "shared")}
        self.denied: set[str] = set()  # resources SelfSubjectAccessReview refuses
        self.lose_next_create_reply = False
        self.version = 0
        self.lock = threading.Condition()
        self.requests: list[tuple[str, str]] = []
        runtime = yaml.safe_load(RUNTIME.read_text())
        self.put("clustertrainingruntimes", "", runtime)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "team") -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}]}))
        return path

    # -- the store ------------------------------------------------------------------------------------------
    def put(self, plural: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.version += 1
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = str(self.version)
            meta.setdefault("uid", f"uid-{self.version}")
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if namespace:
                meta["namespace"] = namespace
            self.objects[(plural, namespace, meta["name"])] = obj
            self.lock.notify_all()
            return obj

    def collect_garbage(self) -> None:
        """What the cluster's garbage collector does: an object whose owners are all gone goes too."""
        with self.lock:
            uids = {o["metadata"]["uid"] for o in self.objects.values()}
            for key, obj in list(self.objects.items()):
                owners = obj["metadata"].get("ownerReferences") or []
                if owners and not any(o["uid"] in uids for o in owners):
                    del self.objects[key]

    def job(self, name: str, namespace: str = "team") -> dict[str, Any]:
        for plural in ("trainjobs", "pytorchjobs"):
            if (plural, namespace, name) in self.objects:
                return self.objects[(plural, namespace, name)]
        raise KeyError(name)

    def set_condition(self, name: str, kind: str, reason: str = "", namespace: str = "team",
                      at: float | str | None = None) -> None:
        """What the controller does: condition ``kind`` becomes true, its lastTransitionTime ``at`` (epoch seconds,
        default now; a string is written as it is)."""
        obj = copy.deepcopy(self.job(name, namespace))
        stamp = at if isinstance(at, str) else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        conditions = [c for c in obj.setdefault("status", {}).get("conditions", []) if c["type"] != kind]
        conditions.append({"type": kind, "status": "True", "reason": reason, "message": reason,
                           "lastTransitionTime": stamp})
        obj["status"]["conditions"] = conditions
        self.put(f"{obj['kind'].lower()}s", namespace, obj)

    def add_pod(self, job: str, rank: int, log: str = "", namespace: str = "team", disrupted: bool = False,
                exit_code: int | None = None) -> None:
        obj = self.job(job, namespace)
        if obj["kind"] == "TrainJob":
            name = f"{job}-node-0-{rank}"
            labels = {"jobset.sigs.k8s.io/jobset-name": job, "batch.kubernetes.io/job-completion-index": str(rank)}
        else:
            role, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
            name = f"{job}-{role}-{index}"
            labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": role,
                      "training.kubeflow.org/replica-index": str(index)}
        status: dict[str, Any] = {"phase": "Running", "startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if disrupted:
            status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
        if exit_code is not None:
            status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": exit_code}}}]
        self.put("pods", namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                                     "status": status})
        self.logs[(namespace, name)] = self.logs.get((namespace, name), "") + log
        if obj["kind"] == "TrainJob":
            running = copy.deepcopy(obj)
            running.setdefault("status", {})["jobsStatus"] = [{"name": "node", "ready": 1, "active": 1, "failed": 0,
                                                               "succeeded": 0, "suspended": 0}]
            self.put("trainjobs", namespace, running)

    # -- admission ------------------------------------------------------------------------------------------
    def refusals(self, plural: str, namespace: str, body: dict[str, Any]) -> list[tuple[str, str]]:
        kind = PLURALS[plural]
        if body.get("kind") != kind:
            return [("kind", f"expected {kind}")]
        found = [*vendored.meta_errors(body), *_cel(kind, body), *vendored.jsonschema_errors(body)]
        if kind == "TrainJob":  # the Trainer's validating webhook
            ref = body.get("spec", {}).get("runtimeRef", {})
            if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime" and \
                    ("clustertrainingruntimes", "", ref.get("name")) not in self.objects:
                found.append(("spec.runtimeRef", f'clustertrainingruntimes.trainer.kubeflow.org "{ref.get("name")}" '
                                                 "not found: specified clusterTrainingRuntime must be created before "
                                                 "the TrainJob is created"))
            found += [p for p in vendored.webhook_errors(body)]
        elif kind == "PyTorchJob":
            found += vendored.webhook_errors(body)
        return found

    # -- HTTP -----------------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, content: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str, causes: list[tuple[str, str]] = ()) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                  "reason": reason, "message": message,
                                  "details": {"causes": [{"field": f, "message": m} for f, m in causes]}})

            def _body(self) -> Any:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")

            def _route(self) -> tuple[str, str, str | None, str | None, dict[str, list[str]]]:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                parts = url.path.strip("/").split("/")
                fake.requests.append((self.command, url.path))
                if parts[:2] == ["api", "v1"]:
                    parts = parts[2:]
                elif parts[0] == "apis":
                    parts = parts[3:]
                if parts and parts[0] == "namespaces" and len(parts) >= 3:
                    return parts[2], parts[1], parts[3] if len(parts) > 3 else None, \
                        parts[4] if len(parts) > 4 else None, query
                if parts and parts[0] == "namespaces":
                    return "namespaces", "", parts[1] if len(parts) > 1 else None, None, query
                return parts[0], "", parts[1] if len(parts) > 1 else None, None, query

            def do_GET(self) -> None:
                plural, namespace, name, sub, query = self._route()
                if plural == "namespaces":
                    if name in fake.namespaces:
                        return self._send(200, {"kind": "Namespace", "metadata": {"name": name}})
                    return self._status(404, "NotFound", f'namespaces "{name}" not found')
                if plural == "persistentvolumeclaims":
                    if (namespace, name) in fake.claims:
                        return self._send(200, {"kind": "PersistentVolumeClaim", "metadata": {"name": name},
                                                "spec": {"accessModes": ["ReadWriteMany"]}})
                    return self._status(404, "NotFound", f'persistentvolumeclaims "{name}" not found')
                if namespace and namespace not in fake.namespaces:
                    return self._status(404, "NotFound", f'namespaces "{namespace}" not found')
                if sub == "log":
                    return self._send(200, fake.logs.get((namespace, name), ""), "text/plain")
                if name:
                    obj = fake.objects.get((plural, namespace, name))
                    return self._send(200, obj) if obj else self._status(404, "NotFound", f'{plural} "{name}" not '
                                                                                          "found")
                labels, fields = (query.get("labelSelector") or [None])[0], (query.get("fieldSelector") or [None])[0]
                if (query.get("watch") or ["false"])[0].lower() == "true":
                    return self._watch(plural, namespace, labels, fields, query)
                items = [o for (p, ns, _), o in sorted(fake.objects.items())
                         if p == plural and ns == namespace and _selected(o, labels, fields)]
                self._send(200, {"kind": "List", "metadata": {"resourceVersion": str(fake.version)}, "items": items})

            def _watch(self, plural: str, namespace: str, labels: str | None, fields: str | None,
                       query: dict[str, list[str]]) -> None:
                since = int((query.get("resourceVersion") or ["0"])[0] or 0)
                deadline = time.monotonic() + float((query.get("timeoutSeconds") or ["5"])[0])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                while time.monotonic() < deadline:
                    with fake.lock:
                        changed = [o for (p, ns, _), o in fake.objects.items() if p == plural and ns == namespace
                                   and int(o["metadata"]["resourceVersion"]) > since and _selected(o, labels, fields)]
                        if not changed:
                            fake.lock.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                            continue
                    for obj in sorted(changed, key=lambda o: int(o["metadata"]["resourceVersion"])):
                        since = int(obj["metadata"]["resourceVersion"])
                        try:
                            self.wfile.write((json.dumps({"type": "MODIFIED", "object": obj}) + "\n").encode())
                            self.wfile.flush()
                        except OSError:
                            return

            def do_POST(self) -> None:
                plural, namespace, _name, _sub, _query = self._route()
                body = self._body()
                if plural == "selfsubjectaccessreviews":
                    resource = body["spec"]["resourceAttributes"]["resource"]
                    return self._send(201, {**body, "status": {"allowed": resource not in fake.denied}})
                if namespace not in fake.namespaces:
                    return self._status(404, "NotFound", f'namespaces "{namespace}" not found')
                if plural in PLURALS:
                    refused = fake.refusals(plural, namespace, body)
                    if refused:
                        kind = PLURALS[plural]
                        return self._status(422, "Invalid", f'{kind} "{body["metadata"].get("name")}" is invalid: '
                                            + "; ".join(f"{f}: {m}" for f, m in refused), refused)
                if plural == "secrets":
                    _encode_secret(body)
                key = (plural, namespace, body["metadata"]["name"])
                if key in fake.objects:
                    return self._status(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
                if plural == "trainjobs" and "kueue.x-k8s.io/queue-name" in body["metadata"].get("labels", {}):
                    body["spec"]["suspend"] = True  # Kueue's webhook: created suspended until admitted
                    body["status"] = {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended",
                                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
                created = fake.put(plural, namespace, body)
                if fake.lose_next_create_reply and plural in PLURALS:
                    fake.lose_next_create_reply = False
                    self.close_connection = True
                    self.connection.close()  # created, and no answer
                    return
                self._send(201, created)

            def do_PATCH(self) -> None:
                plural, namespace, name, _sub, _query = self._route()
                key = (plural, namespace, name)
                if key not in fake.objects:
                    return self._status(404, "NotFound", f'{plural} "{name}" not found')
                if "merge-patch" not in (self.headers.get("Content-Type") or ""):
                    return self._status(415, "UnsupportedMediaType", "this fake takes merge patches only")
                patched = _merge(copy.deepcopy(fake.objects[key]), self._body())
                if plural == "secrets":
                    _encode_secret(patched)
                spec = patched.get("spec", {})
                if spec.get("suspend") or spec.get("runPolicy", {}).get("suspend"):  # the controller stops the pods
                    conditions = [c for c in patched.setdefault("status", {}).get("conditions", [])
                                  if c["type"] != "Suspended"]
                    conditions.append({"type": "Suspended", "status": "True", "reason": "Suspended",
                                       "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                    patched["status"]["conditions"] = conditions
                    patched["status"]["jobsStatus"] = []
                self._send(200, fake.put(plural, namespace, patched))

            def do_DELETE(self) -> None:
                plural, namespace, name, _sub, _query = self._route()
                found = fake.objects.pop((plural, namespace, name), None)
                if found is None:
                    return self._status(404, "NotFound", f'{plural} "{name}" not found')
                fake.collect_garbage()
                self._send(200, {"kind": "Status", "status": "Success"})

        return Handler


NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# -- what the Kubernetes tests share: a staged job, the provider, the pod as the kubelet runs it ---------------

STAGED = {"providers": {"kubernetes": {"staging": "pvc://shared/cloudtrain", "namespace": "team"}}}


def provider() -> Any:
    from cloudtrain.providers.kubernetes.provider import KubernetesProvider

    return KubernetesProvider(log_poll=0.2)


def job(project: Path, **fields: Any) -> Job:
    return Job(script="train_ddp.py", source_dir=str(project), **{**copy.deepcopy(STAGED), **fields})


# -- plan -------------------------------------------------------------------------------------------------------------


def node_run(body: dict[str, Any], root: Path, env: dict[str, str] | None = None,
             python: list[str] | None = None, kube: FakeKube | None = None) -> Any:
    """The TrainJob's node container as its pod would run it (trainer.command with trainer.env, a secretKeyRef read
    from the Secret stored in ``kube`` as the kubelet does), on this machine: the pod's /cloudtrain emptyDir (and the
    mounts under it) is ``root``; python3 is this interpreter."""
    import base64
    import subprocess

    from cloudtrain.providers.kubernetes import request as rq

    def here(value: str) -> str:
        return value.replace(rq.ROOT + "/", f"{root}/")

    root.mkdir(parents=True, exist_ok=True)  # the emptyDir
    trainer = body["spec"]["trainer"]
    command = list(trainer["command"])
    assert command[:2] == [command[0], "-c"] and command[2] == rq.FETCH_SOURCE.read_text(encoding="utf-8")
    exe = python or [sys.executable]
    command = [*exe, "-c", command[2], *(here(a) if a != command[0] else sys.executable for a in command[3:])]
    def value(entry: dict[str, Any]) -> str:
        if "value" in entry:
            return here(entry["value"])
        ref = entry["valueFrom"]["secretKeyRef"]
        assert kube is not None, f"{entry['name']} is read from Secret {ref['name']}: pass the cluster"
        stored = kube.objects[("secrets", body["metadata"]["namespace"], ref["name"])]
        return base64.b64decode(stored["data"][ref["key"]]).decode()

    node_env = {e["name"]: value(e) for e in trainer["env"]}
    # what the Trainer's torch plugin sets on node 0 (its service name redirected to this machine)
    from cloudtrain.providers.kubernetes import node as contract_node
    from tests.emulators import free_port

    emulated, _ = contract_node.emulate(1, 0, free_port(), root / "node", body["metadata"]["name"])
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR") or k.startswith("AWS_")}
    full = {**keep, **node_env, **emulated, "PET_NPROC_PER_NODE": "1", **(env or {})}
    return subprocess.run(command, env=full, capture_output=True, text=True, timeout=240, cwd=root)


def mount_configmaps(kube: FakeKube, namespace: str, names: list[str], folder: Path) -> None:
    """The projected volume of the job's ConfigMaps as the kubelet writes it: every key a symlink into ..data, a
    symlink to a timestamped folder holding the decoded values."""
    import base64

    stamped = folder / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir(parents=True)
    (folder / "..data").symlink_to(stamped.name)
    for name in names:
        stored = kube.objects[("configmaps", namespace, name)]
        files = {**{k: v.encode() for k, v in (stored.get("data") or {}).items()},
                 **{k: base64.b64decode(v) for k, v in (stored.get("binaryData") or {}).items()}}
        for key, value in files.items():
            (stamped / key).write_bytes(value)
            (folder / key).symlink_to(f"..data/{key}")
