"""The cluster's REST API through the official ``kubernetes`` client (imported here, at first use: never by a plan).

Why the official client and not plain HTTP: it reads kubeconfig as kubectl does (client certificates, tokens, exec
credential plugins such as ``aws eks get-token`` and ``gke-gcloud-auth-plugin``, in-cluster service accounts), which
a plain HTTP client would have to re-implement. Only its generic parts are used (CustomObjectsApi, CoreV1Api, plain
dicts in and out), so the requests are exactly the plan's.

Every call's failure becomes one clear error: the namespace or runtime that does not exist, what RBAC refused (and
the verb and resource to grant), the field the API server refused, never an HTTP dump."""

from __future__ import annotations

import builtins
import json
from typing import Any

from cloudtrain.errors import CloudtrainError, SpecError, UserError

LOST = (ConnectionError, TimeoutError)  # plus urllib3's errors, added by Kube.lost()
MERGE_PATCH = "application/merge-patch+json"  # the core API's client picks json-patch for a dict body otherwise


class Kube:
    def __init__(self, context: str | None = None, config_file: str | None = None, timeout: float = 30.0) -> None:
        self.context, self.config_file, self.timeout = context, config_file, timeout
        self._api: Any = None

    # -- connection -------------------------------------------------------------------------------------
    @property
    def api(self) -> Any:
        if self._api is None:
            import os

            from kubernetes import client, config

            # the client reads $KUBECONFIG once, when it is imported: pass it as it is now
            files = self.config_file or os.environ.get("KUBECONFIG") or "~/.kube/config"
            try:
                self._api = config.new_client_from_config(config_file=files, context=self.context)
            except config.ConfigException as exc:
                try:  # inside a pod: its service account
                    configuration = client.Configuration()
                    config.load_incluster_config(client_configuration=configuration)
                    self._api = client.ApiClient(configuration)
                except config.ConfigException:
                    raise UserError(f"no Kubernetes cluster to talk to: {exc}", field="providers.kubernetes.context",
                                    remedy="set KUBECONFIG (or ~/.kube/config) and providers.kubernetes.context to "
                                           "one of its contexts (`kubectl config get-contexts`)") from None
        return self._api

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @staticmethod
    def lost() -> tuple[type[BaseException], ...]:
        """What a request whose answer never came raises (the job may exist all the same)."""
        import urllib3

        return (*LOST, urllib3.exceptions.HTTPError)

    def call(self, what: str, fn: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            raise api_error(what, exc.status, exc.body) from None

    # -- objects --------------------------------------------------------------------------------------------
    def create(self, res: tuple[str, str, str, str], namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        group, version, plural, kind = res
        return self.call(f"creating {kind} {body['metadata']['name']}", self.custom.create_namespaced_custom_object,
                         group, version, namespace, plural, body)

    def get(self, res: tuple[str, str, str, str], namespace: str, name: str) -> dict[str, Any] | None:
        group, version, plural, kind = res
        return self.call(f"reading {kind} {namespace}/{name}", self.custom.get_namespaced_custom_object, group,
                         version, namespace, plural, name, missing_ok=True)

    def list(self, res: tuple[str, str, str, str], namespace: str, selector: str) -> builtins.list[dict[str, Any]]:
        group, version, plural, kind = res
        found = self.call(f"listing {kind}s in {namespace}", self.custom.list_namespaced_custom_object, group,
                          version, namespace, plural, label_selector=selector, missing_ok=True)
        return list((found or {}).get("items") or [])

    def patch(self, res: tuple[str, str, str, str], namespace: str, name: str, body: dict[str, Any]) -> Any:
        group, version, plural, kind = res
        return self.call(f"updating {kind} {namespace}/{name}", self.custom.patch_namespaced_custom_object, group,
                         version, namespace, plural, name, body, missing_ok=True)

    def watch_once(self, res: tuple[str, str, str, str], namespace: str, name: str, since: str,
                   seconds: float) -> str:
        """Wait until the job changes after resourceVersion ``since``, at most ``seconds`` (a watch on its name);
        returns the resourceVersion seen last."""
        from kubernetes import watch

        group, version, plural, _ = res
        stream = watch.Watch().stream(self.custom.list_namespaced_custom_object, group, version, namespace, plural,
                                      field_selector=f"metadata.name={name}", resource_version=since,
                                      timeout_seconds=max(1, int(seconds)), _request_timeout=seconds + 5)
        for event in stream:
            obj = event.get("object") or {}
            return str((obj.get("metadata") or {}).get("resourceVersion") or since)
        return since

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.call(f"reading ConfigMap {namespace}/{name}", self.core.read_namespaced_config_map, name,
                          namespace, missing_ok=True)
        return self.api.sanitize_for_serialization(found) if found is not None else None

    def create_configmap(self, namespace: str, body: dict[str, Any]) -> None:
        self.call(f"creating ConfigMap {body['metadata']['name']}", self.core.create_namespaced_config_map,
                  namespace, body)

    def put_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the job's Secret, or bring one this job made before (a retried submit) up to date; one of the
        same name that another job made is refused."""
        name = body["metadata"]["name"]
        found = self.call(f"reading Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace,
                          missing_ok=True)
        if found is None:
            self.call(f"creating Secret {name}", self.core.create_namespaced_secret, namespace, body)
            return
        labels = (found.metadata.labels or {}) if found.metadata else {}
        if any(labels.get(key) != value for key, value in body["metadata"]["labels"].items()):  # the job's labels
            raise UserError(f"a Secret named {name} exists in {namespace} and is not this job's",
                            remedy="plan the job again (it gets a new name), or delete that Secret")
        self.call(f"updating Secret {namespace}/{name}", self.core.patch_namespaced_secret, name, namespace,
                  {"stringData": body["stringData"]}, _content_type=MERGE_PATCH)

    def delete_secret(self, namespace: str, name: str) -> None:
        self.call(f"deleting Secret {namespace}/{name}", self.core.delete_namespaced_secret, name, namespace,
                  missing_ok=True)

    def own_secret(self, namespace: str, name: str, res: tuple[str, str, str, str], job_id: str) -> None:
        """Add the job as an owner of the Secret, so that the cluster deletes the Secret with the last job that
        reads it."""
        group, version, _plural, kind = res
        job = self.get(res, namespace, job_id)
        found = self.call(f"reading Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace,
                          missing_ok=True)
        if job is None or found is None:
            return
        owners = [self.api.sanitize_for_serialization(o) for o in (found.metadata.owner_references or [])]
        uid = job["metadata"]["uid"]
        if any(o.get("uid") == uid for o in owners):
            return
        owners.append({"apiVersion": f"{group}/{version}", "kind": kind, "name": job_id, "uid": uid})
        self.call(f"updating Secret {namespace}/{name}", self.core.patch_namespaced_secret, name, namespace,
                  {"metadata": {"ownerReferences": owners}}, _content_type=MERGE_PATCH)

    def pods(self, namespace: str, selector: str) -> builtins.list[dict[str, Any]]:
        found = self.call(f"listing pods in {namespace}", self.core.list_namespaced_pod, namespace,
                          label_selector=selector)
        return list(self.api.sanitize_for_serialization(found).get("items") or [])

    def log(self, namespace: str, pod: str, container: str) -> str:
        answer = self.call(f"reading the log of pod {namespace}/{pod}", self.core.read_namespaced_pod_log, pod,
                           namespace, container=container, missing_ok=True, _preload_content=False)
        return answer.data.decode("utf-8", errors="replace") if answer is not None else ""

    def namespace(self, name: str) -> dict[str, Any] | None:
        found = self.call(f"reading namespace {name}", self.core.read_namespace, name, missing_ok=True)
        return self.api.sanitize_for_serialization(found) if found is not None else None

    def can(self, verb: str, group: str, resource: str, namespace: str) -> bool:
        from kubernetes import client

        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                  "namespace": namespace}}}
        answer = self.call("asking what this account may do", client.AuthorizationV1Api(self.api)
                           .create_self_subject_access_review, review)
        return bool(self.api.sanitize_for_serialization(answer).get("status", {}).get("allowed"))

    def cluster_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any] | None:
        return self.call(f"reading {plural} {name}", self.custom.get_cluster_custom_object, group, version, plural,
                         name, missing_ok=True)


def api_error(what: str, status: int | None, body: Any) -> CloudtrainError:
    """One readable error from the API server's Status answer."""
    try:
        answer = json.loads(body) if isinstance(body, (str, bytes)) else dict(body or {})
    except ValueError:
        answer = {}
    message = str(answer.get("message") or body or "")[:500]
    if status == 422:
        causes = (answer.get("details") or {}).get("causes") or []
        where = causes[0].get("field") if causes else None
        return SpecError(f"{what}: the cluster refused it: {message}", field=where,
                         remedy="the plan's request (`cloudtrain plan -o json`) shows the field; report it if "
                                "cloudtrain produced it")
    if status in (401, 403):
        return UserError(f"{what}: the cluster refused this account ({status}): {message}",
                         field="providers.kubernetes.context",
                         remedy="grant the Role in docs/providers/kubernetes.md (create/get/list/watch/patch TrainJobs "
                                "or PyTorchJobs, get/list pods and pods/log, create/get ConfigMaps) or choose another "
                                "context")
    if status == 404:
        return UserError(f"{what}: not found: {message}", field="providers.kubernetes.namespace",
                         remedy="check the namespace, and that the Kubeflow Trainer (or Training Operator) CRDs are "
                                "installed: `cloudtrain doctor -p kubernetes`")
    return CloudtrainError(f"{what}: the cluster answered {status}: {message}",
                           remedy="try again; `cloudtrain doctor -p kubernetes` checks the cluster")
