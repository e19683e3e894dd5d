"""Check a TrainJob or PyTorchJob offline, before anything is sent, as the cluster would: the CRD's own
``openAPIV3Schema`` (vendored in crds/, see crds/README.md; checked here by ``_walk``, held to jsonschema's verdict by
the tests, and by jsonschema itself in the tests' fake API server), its CEL rules that apply on create, the
object-meta rules the API server applies to every object, and the Trainer's and the Training Operator's admission
webhooks' refusals. A refused job never leaves the client: the error names the field path and the fix.

Unknown fields are refused (as ``kubectl apply --validate=strict`` does), where the API server would drop them
silently. The CEL rules are re-expressed here in Python (``CEL_TWINS``): cel-python evaluates the same rules in the
tests' fake API server, and a test checks that the twins agree with it and that every create-time rule of the
vendored CRDs has a twin (importing and compiling CEL would cost the plan ~0.15 s)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from cloudtrain.errors import SpecError
from cloudtrain.providers.kubernetes.node import RESERVED

CRDS = Path(__file__).with_name("crds")
KINDS = {"TrainJob": "trainjob", "ClusterTrainingRuntime": "clustertrainingruntime", "PyTorchJob": "pytorchjob"}
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PYTORCHJOB_RESERVED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")  # the operator appends its own
MAX_ANNOTATIONS = 256 * 1024  # bytes, keys and values together (apimachinery TotalAnnotationSizeLimitB)

# Which cloudtrain setting made each part of the request: the fix a refusal names.
FIXES = (("metadata.name", "shorten the spec's name (the job name is <name>-<date>-<time>-<hex>)"),
         ("metadata.labels.kueue.x-k8s.io/queue-name", "set providers.kubernetes.queue to a LocalQueue's name"),
         ("metadata.namespace", "set providers.kubernetes.namespace to a Kubernetes name"),
         ("spec.runtimeRef", "set providers.kubernetes.runtime to a ClusterTrainingRuntime's name"),
         ("spec.trainer.numNodes", "set --nodes to 1 or more"),
         ("spec.trainer.numProcPerNode", "set procs_per_node to a number (1 or more)"),
         ("spec.trainer.resourcesPerNode", "check --gpus and providers.kubernetes.gpu_resource, cpus_per_node, "
                                           "memory"),
         ("spec.trainer.env", "rename or remove that variable in the spec's env"),
         ("spec.trainer.image", "set providers.kubernetes.image (or image.uri) to an image reference"),
         ("spec.activeDeadlineSeconds", "set max_runtime to 1 second or more"),
         ("spec.runtimePatches", "check providers.kubernetes.node_selector, tolerations, service_account and "
                                 "grace_period"),
         ("spec.pytorchReplicaSpecs", "check providers.kubernetes.image, node_selector, tolerations and the spec's "
                                      "env"),
         ("spec.runPolicy", "check max_runtime, max_restarts and providers.kubernetes.queue"))


@cache
def crd(kind: str) -> dict[str, Any]:
    """The vendored CRD document (group, version, kind, plural, scope, openAPIV3Schema)."""
    data: dict[str, Any] = json.loads((CRDS / f"{KINDS[kind]}.json").read_text(encoding="utf-8"))
    return data


def strict(node: Any) -> Any:
    """The schema as JSON Schema that refuses unknown fields: objects with declared properties get
    ``additionalProperties: false`` unless Kubernetes keeps unknown fields there."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def validator(kind: str) -> Any:
    import jsonschema

    return jsonschema.Draft7Validator(_strict_schema(kind))


def _path(parts: Iterator[Any] | list[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}


def _walk(node: dict[str, Any], value: Any, where: str, out: list[tuple[str, str]]) -> None:
    """The OpenAPI v3 subset the Kubeflow CRDs use (type, properties, required, items, additionalProperties, anyOf,
    enum, pattern, min/max of lengths, items, properties and values), unknown fields refused. jsonschema (the
    reference: ``validator``, a test compares them) costs ~0.1 s to import, more than the whole check here."""
    kind = node.get("type")
    if kind and not _TYPES[kind](value):
        out.append((where, f"{value!r} is not of type {kind!r}"))
        return
    if "anyOf" in node and not any(not _errors(branch, value) for branch in node["anyOf"]):
        out.append((where, f"{value!r} is not valid under any of the given schemas"))
    if "enum" in node and value not in node["enum"]:
        out.append((where, f"{value!r} is not one of {node['enum']}"))
    if isinstance(value, str):
        if len(value) > node.get("maxLength", len(value)) or len(value) < node.get("minLength", 0):
            out.append((where, f"{value[:60]!r} is not {node.get('minLength', 0)} to {node.get('maxLength')} long"))
        if "pattern" in node and not re.search(node["pattern"], value):
            out.append((where, f"{value[:60]!r} does not match {node['pattern']!r}"))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < node.get("minimum", value) or value > node.get("maximum", value):
            out.append((where, f"{value} is outside {node.get('minimum')}..{node.get('maximum')}"))
    elif isinstance(value, list):
        if len(value) > node.get("maxItems", len(value)) or len(value) < node.get("minItems", 0):
            out.append((where, f"{len(value)} items: allowed {node.get('minItems', 0)} to {node.get('maxItems')}"))
        for i, item in enumerate(value):
            if isinstance(node.get("items"), dict):
                _walk(node["items"], item, f"{where}[{i}]", out)
    elif isinstance(value, dict):
        if len(value) < node.get("minProperties", 0):
            out.append((where, f"needs at least {node['minProperties']} properties"))
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        for name in node.get("required") or []:
            if name not in value:
                out.append((f"{where}.{name}" if where else name, "required"))
        for name, item in value.items():
            at = f"{where}.{name}" if where else name
            if name in props:
                _walk(props[name], item, at, out)
            elif isinstance(extra, dict):
                _walk(extra, item, at, out)
            elif extra is False:
                out.append((at, "unknown field"))


def _errors(node: dict[str, Any], value: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    _walk(node, value, "", out)
    return out


@cache
def _strict_schema(kind: str) -> dict[str, Any]:
    found: dict[str, Any] = strict(crd(kind)["openAPIV3Schema"])
    found["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by meta_errors, as the server does
    return found


def schema_errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(field path, what is wrong) for each place the CRD's schema refuses."""
    if body.get("kind") not in KINDS:
        return [("kind", f"{body.get('kind')!r} is not one of {sorted(KINDS)}")]
    return [(where or "(the object)", what) for where, what in _errors(_strict_schema(body["kind"]), body)]


def jsonschema_errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The same check through jsonschema (the tests' fake API server, and the reference schema_errors is held to)."""
    found = []
    for error in validator(body.get("kind", "")).iter_errors(body):
        where = _path(list(error.absolute_path))
        if error.validator == "additionalProperties":
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            where, what = (f"{where}.{extra[0]}" if where else extra[0]) if extra else where, "unknown field"
        else:
            what = error.message if len(error.message) < 200 else error.message[:200] + "..."
        found.append((where or "(the object)", what))
    return found


def meta_errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    """What the API server checks in every object's metadata (apimachinery's ValidateObjectMeta), in short."""
    meta, found = body.get("metadata") or {}, []
    namespace = meta.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not RFC1123_LABEL.match(namespace)):
        found.append(("metadata.namespace", f"{namespace!r} is not a DNS-1123 label"))
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) or len(name) > 63 \
                or not LABEL_NAME.match(name):
            found.append((f"metadata.labels.{key}", "not a label key"))
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            found.append((f"metadata.labels.{key}", f"{value!r} is not a label value (at most 63 letters, digits, "
                                                    "'-', '_' or '.', starting and ending with a letter or digit)"))
    size = sum(len(k) + len(str(v)) for k, v in (meta.get("annotations") or {}).items())
    if size > MAX_ANNOTATIONS:
        found.append(("metadata.annotations", f"{size} bytes, more than {MAX_ANNOTATIONS}"))
    return found


# -- the CRDs' CEL rules that apply on create (transition rules, ``oldSelf``, apply only to updates) ----------------
def _name_rfc1035(obj: Any) -> bool:
    return bool(RFC1035.match(obj["metadata"]["name"]))


CEL_TWINS: dict[str, Callable[[Any], bool]] = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": _name_rfc1035,
    "size(self.metadata.name) <= 63": lambda obj: len(obj["metadata"]["name"]) <= 63,
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')":
        lambda value: value == "" or bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$", value)),
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']":
        lambda value: value in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"),
    "has(self.lastUpdatedTime)": lambda value: "lastUpdatedTime" in value,  # status only: never in a request
}


def cel_rules(schema: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    """Every ``x-kubernetes-validations`` rule with the property path it sits on (``*``: each item)."""
    if not isinstance(schema, dict):
        return
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in (schema.get("properties") or {}).items():
        yield from cel_rules(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from cel_rules(schema["items"], (*path, "*"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from cel_rules(schema["additionalProperties"], (*path, "*"))


def values_at(obj: Any, path: tuple[str, ...], where: str = "") -> Iterator[tuple[str, Any]]:
    if not path:
        yield where, obj
        return
    head, rest = path[0], path[1:]
    if head == "*":
        items = enumerate(obj) if isinstance(obj, list) else obj.items() if isinstance(obj, dict) else []
        for key, value in items:
            yield from values_at(value, rest, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")
    elif isinstance(obj, dict) and head in obj:
        yield from values_at(obj[head], rest, f"{where}.{head}" if where else head)


def create_rules(kind: str) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    return [(path, rule) for path, rule in cel_rules(crd(kind)["openAPIV3Schema"]) if "oldSelf" not in rule["rule"]]


def cel_errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for path, rule in create_rules(body["kind"]):
        twin = CEL_TWINS.get(rule["rule"])
        if twin is None:  # a vendored CRD with a rule this module does not know yet: tests/test_kubernetes.py
            continue
        for where, value in values_at(body, path):
            try:
                ok = twin(value)
            except (KeyError, TypeError):
                ok = False
            if not ok:
                found.append((where or "metadata.name" if not path else where, rule.get("message", rule["rule"])))
    return found


# -- the admission webhooks' refusals ---------------------------------------------------------------------------
def webhook_errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    """kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/torch (reserved PET_* env) for a TrainJob; Training
    Operator v1.9 pkg/webhooks/pytorch (DNS-1035 name, a Master of 1 replica, a container named "pytorch" with an
    image) for a PyTorchJob."""
    found: list[tuple[str, str]] = []
    if body["kind"] == "TrainJob":
        env = ((body.get("spec") or {}).get("trainer") or {}).get("env") or []
        reserved = sorted({e.get("name") for e in env if e.get("name") in RESERVED})
        if reserved:
            found.append(("spec.trainer.env", f"must not have reserved envs, invalid envs configured: {reserved} "
                                              "(the Trainer's torch plugin sets them)"))
    elif body["kind"] == "PyTorchJob":
        name = (body.get("metadata") or {}).get("name", "")
        if len(name) > 63 or not RFC1035.match(name):
            found.append(("metadata.name", "should match a DNS-1035 label"))
        specs = (body.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        if (specs.get("Master") or {}).get("replicas", 1) != 1:
            found.append(("spec.pytorchReplicaSpecs.Master.replicas", "must be 1"))
        for role, rspec in specs.items():
            containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
            where = f"spec.pytorchReplicaSpecs.{role}.template.spec.containers"
            if not any(c.get("name") == "pytorch" and c.get("image") for c in containers):
                found.append((where, "must have a container named pytorch, with an image"))
            for c in containers:
                names = sorted({e.get("name") for e in c.get("env") or []} & {*RESERVED, *PYTORCHJOB_RESERVED})
                if names:
                    found.append((f"{where}.env", f"{names}: the Training Operator sets these itself"))
    return found


def problems(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [*meta_errors(body), *cel_errors(body), *schema_errors(body), *webhook_errors(body)]


def fix_for(where: str) -> str:
    return next((fix for prefix, fix in FIXES if where.startswith(prefix)),
                "check the providers.kubernetes settings behind it (`cloudtrain plan -o json` shows the request)")


def check(body: dict[str, Any]) -> None:
    """Refuse, naming the first field at fault and the fix (all of them in the message, if several)."""
    found = problems(body)
    if not found:
        return
    where, what = found[0]
    more = f" (and {len(found) - 1} more: " + "; ".join(f"{w}: {m}" for w, m in found[1:4]) + ")" \
        if len(found) > 1 else ""
    raise SpecError(f"the {body['kind']} would be refused by the cluster: {what}{more}",
                    field=f"{body['kind']} {where}", remedy=fix_for(where))
