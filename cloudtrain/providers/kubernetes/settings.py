"""Where a Kubernetes setting comes from when neither the spec, the environment nor cloudtrain's profile sets it:
the kubeconfig (as kubectl reads it: $KUBECONFIG, else ~/.kube/config), else the pod's own service account."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def kubeconfig_files(env: Any = None) -> list[Path]:
    env = os.environ if env is None else env
    listed = [p for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p]
    return [Path(p).expanduser() for p in listed] or [Path("~/.kube/config").expanduser()]


def kubeconfig(env: Any = None) -> tuple[dict[str, Any], str] | None:
    """The first kubeconfig file that reads as one (kubectl merges them; the current context is the first file's)."""
    import yaml

    for path in kubeconfig_files(env):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            return data, str(path)
    return None


def context_namespace(data: dict[str, Any], context: str | None) -> str | None:
    name = context or data.get("current-context")
    for entry in data.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return (entry.get("context") or {}).get("namespace")
    return None


def platform_setting(key: str, setting: Callable[[str], Any]) -> tuple[Any, str] | None:
    """context: the kubeconfig's current-context; namespace: that context's namespace (the context in use, as
    ``setting`` resolves it), else the pod's own."""
    if key not in ("context", "namespace"):
        return None
    found = kubeconfig()
    if found:
        data, where = found
        if key == "context" and data.get("current-context"):
            return data["current-context"], f"kubeconfig {where}"
        if key == "namespace":
            namespace = context_namespace(data, setting("context"))
            if namespace:
                return namespace, f"kubeconfig {where}"
    if key == "namespace":
        try:
            return (SERVICE_ACCOUNT / "namespace").read_text().strip(), "the pod's service account"
        except OSError:
            return None
    return None
