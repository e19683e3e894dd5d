"""`cloudtrain doctor` for Kubernetes: a kubeconfig context (or the pod's service account), the namespace and what
this account may do there, the runtime a TrainJob names (and its restart budget), and the staging location."""

from __future__ import annotations

from typing import Any

from cloudtrain.errors import CloudtrainError
from cloudtrain.job_types import Check
from cloudtrain.platforms.doctor_kit import PLACEHOLDER, Context, setting, setting_check
from cloudtrain.providers.kubernetes.settings import context_namespace, kubeconfig, kubeconfig_files

TRAINER = "trainer.kubeflow.org"  # request.TRAINJOB's group (request.py imports pydantic: doctor must not)


def checks(ctx: Context) -> list[Check]:
    from cloudtrain.registry import _installed

    if not _installed("kubernetes"):
        return [Check("kubernetes", "client", "missing", "the kubernetes package is not installed",
                      "pip install 'cloudtrain[kubernetes]'")]
    context = (setting(ctx, "kubernetes", "context") or (None, ""))[0]
    found = kubeconfig(ctx.env)
    found_check = _context(ctx, found, context)
    out = [found_check]
    if found_check.status != "ok":
        return [*out, _staging(ctx, None, "")]
    namespace = (setting(ctx, "kubernetes", "namespace") or (None, ""))[0] or \
        (context_namespace(found[0], context) if found else None) or "default"
    from cloudtrain.providers.kubernetes.kube import Kube

    kube = Kube(context=context, config_file=str(kubeconfig_files(ctx.env)[0]) if found else None, timeout=10)
    out.append(_namespace(kube, namespace, (setting(ctx, "kubernetes", "api") or ("trainjob", ""))[0]))
    out.append(_runtime(kube, ctx))
    out.append(_staging(ctx, kube, namespace))
    return out


def _context(ctx: Context, found: tuple[dict[str, Any], str] | None, context: str | None) -> Check:
    if found is None:
        if (ctx.env.get("KUBERNETES_SERVICE_HOST")):
            return Check("kubernetes", "context", "ok", "in a pod: its service account")
        return Check("kubernetes", "context", "missing", "no kubeconfig ($KUBECONFIG, ~/.kube/config)",
                     "write one (`kind get kubeconfig`, `gcloud container clusters get-credentials`, `aws eks "
                     "update-kubeconfig`, `az aks get-credentials`)")
    data, where = found
    names = [str(c.get("name")) for c in data.get("contexts") or [] if isinstance(c, dict)]
    chosen = context or data.get("current-context")
    if chosen not in names:
        return Check("kubernetes", "context", "missing", f"context {chosen!r} is not in {where} ({', '.join(names)})",
                     "set providers.kubernetes.context to one of them (`kubectl config get-contexts`)")
    return Check("kubernetes", "context", "ok", f"{chosen} ({where})")


def _namespace(kube: Any, namespace: str, api: str) -> Check:
    plural, group = ("trainjobs", TRAINER) if api == "trainjob" else ("pytorchjobs", "kubeflow.org")
    try:
        allowed = {verb: kube.can(verb, group, plural, namespace) for verb in ("create", "get", "list", "patch")}
        logs = kube.can("get", "", "pods/log", namespace)
    except CloudtrainError as exc:
        return Check("kubernetes", "namespace", "missing", f"{namespace}: the cluster does not answer: {exc.message}",
                     "check the context's server and credentials (`kubectl get ns`)")
    except Exception as exc:  # urllib3/ssl errors: the server cannot be reached
        return Check("kubernetes", "namespace", "missing", f"{namespace}: cannot reach the cluster: "
                                                          f"{type(exc).__name__}", "check the context's server")
    refused = [verb for verb, ok in allowed.items() if not ok] + ([] if logs else ["get pods/log"])
    if refused:
        return Check("kubernetes", "namespace", "missing", f"{namespace}: this account may not "
                                                          f"{', '.join(refused)} {plural}",
                     "grant the Role in docs/providers/kubernetes.md (RBAC)")
    secrets = [verb for verb in ("create", "get", "patch") if not kube.can(verb, "", "secrets", namespace)]
    if secrets:  # only a job with secret variables needs its own Secret
        return Check("kubernetes", "namespace", "warn", f"{namespace}: may create, get, list and patch {plural}, "
                                                       f"but not {', '.join(secrets)} secrets (a job with secret "
                                                       "variables keeps them in a Secret)",
                     "grant the Role in docs/providers/kubernetes.md (RBAC)")
    return Check("kubernetes", "namespace", "ok", f"{namespace}: may create, get, list and patch {plural} "
                                                  "and secrets")


def _runtime(kube: Any, ctx: Context) -> Check:
    name = (setting(ctx, "kubernetes", "runtime") or ("torch-distributed", ""))[0]
    try:
        runtime = kube.cluster_object(TRAINER, "v1alpha1", "clustertrainingruntimes", name)
    except CloudtrainError as exc:
        return Check("kubernetes", "runtime", "missing", f"{name}: {exc.message}",
                     "install Kubeflow Trainer v2 (its CRDs and runtimes)")
    if runtime is None:
        return Check("kubernetes", "runtime", "missing", f"no ClusterTrainingRuntime {name}",
                     "install Kubeflow Trainer's runtimes, or set providers.kubernetes.runtime to one that exists "
                     "(`kubectl get clustertrainingruntimes`)")
    policy = ((runtime.get("spec") or {}).get("template") or {}).get("spec", {}).get("failurePolicy") or {}
    restarts = int(policy.get("maxRestarts") or 0)
    wanted = _max_restarts()
    if restarts < wanted:  # a TrainJob cannot set the JobSet's budget: the runtime's is what the cluster does
        return Check("kubernetes", "runtime", "warn", f"{name}: JobSet failurePolicy.maxRestarts {restarts} is below "
                                                      f"this project's max_restarts {wanted}: after {restarts} "
                                                      "restart(s) the job ends preempted",
                     "set providers.kubernetes.runtime to a runtime with a larger failurePolicy.maxRestarts, or "
                     "follow the job with `cloudtrain wait --recover` (it resubmits, up to max_restarts)")
    return Check("kubernetes", "runtime", "ok", f"{name} (JobSet failurePolicy.maxRestarts {restarts}: a failed or "
                                                f"preempted node restarts the job that many times; max_restarts "
                                                f"{wanted})")


def _max_restarts() -> int:
    """The project's max_restarts (./cloudtrain.yaml), else the spec's default 0; a file that cannot be read is
    reported by the spec check."""
    from cloudtrain.spec.files import project_spec, read_spec_file

    path = project_spec()
    try:
        value = read_spec_file(path).get("max_restarts", 0) if path else 0
    except CloudtrainError:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _staging(ctx: Context, kube: Any, namespace: str) -> Check:
    found = setting(ctx, "kubernetes", "staging")
    if found is None:
        return setting_check(ctx, "kubernetes", "staging", "staging location", PLACEHOLDER, "s3://bucket/cloudtrain")
    value = found[0]
    if value.startswith("pvc://"):
        claim = value[len("pvc://"):].split("/", 1)[0]
        if kube is None:
            return Check("kubernetes", "staging", "warn", f"{value}: the cluster was not reached")
        got = kube.call(f"reading claim {claim}", kube.core.read_namespaced_persistent_volume_claim, claim,
                        namespace, missing_ok=True)
        if got is None:
            return Check("kubernetes", "staging", "missing", f"no PersistentVolumeClaim {claim} in {namespace}",
                         "create a ReadWriteMany claim, or stage through s3://, gs:// or az://")
        modes = kube.api.sanitize_for_serialization(got).get("spec", {}).get("accessModes") or []
        status = "ok" if "ReadWriteMany" in modes else "warn"
        return Check("kubernetes", "staging", status, f"{value} ({found[1]}; access modes {', '.join(modes)})",
                     "" if status == "ok" else "every node mounts it: it must be ReadWriteMany")
    from cloudtrain import storage

    try:
        storage.exists(value.rstrip("/") + "/bundles")
    except Exception as exc:
        return Check("kubernetes", "staging", "missing", f"{value}: {type(exc).__name__}: {str(exc)[:200]}",
                     "check this machine's credentials for the bucket (and the nodes' service account)")
    return Check("kubernetes", "staging", "ok", f"{value} ({found[1]}; the nodes read it with their own identity)")
