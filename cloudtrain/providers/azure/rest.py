"""The body of ``PUT .../jobs/<name>`` for a command job, as azure-ai-ml builds it from the job YAML
(``load_job(...)._to_job()._to_rest_object()``), without importing the SDK. It covers the fields cloudtrain's job
has; a test compares it with the SDK's own body for every plan in the test matrix.

Two ids are only known at submit, when the SDK uploads the code folder and registers an inline environment: the
body shows the code folder and the image in their place.
"""

from __future__ import annotations

import re
from typing import Any

_REST_NAMES = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "mpi": "Mpi", "spot": "Spot", "basic": "Basic",
               "standard": "Standard", "premium": "Premium", "null": "Null"}
_KNOWN = {"$schema", "type", "name", "display_name", "experiment_name", "description", "code", "command",
          "environment", "environment_variables", "distribution", "resources", "limits", "tags", "inputs", "compute",
          "queue_settings"}


def iso_duration(seconds: int) -> str:
    """Seconds as the SDK writes a timeout (isodate's format of a timedelta): P1D, PT2H30M, P1DT1H1M1S."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    time = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (secs, "S")) if n)
    return "P" + (f"{days}D" if days else "") + (f"T{time}" if time else "") if days or time else "P0D"


def _double_brackets(command: str) -> str:
    """{inputs.x} -> ${{inputs.x}}, as the SDK rewrites a command before sending it."""
    for prefix in ("inputs", "outputs", "search_space"):
        command = re.sub(r"(?<!\{)\{" + prefix + r"\.([^}]*)\}(?!\})", r"${{" + prefix + r".\g<1>}}", command)
    return command


def body(job: dict[str, Any]) -> dict[str, Any]:
    """The REST body for cloudtrain's command job YAML (a dict that passed ``schema.check_job``)."""
    unknown = set(job) - _KNOWN
    if unknown:  # a field added to the job without its REST form here: the plan would hide it
        raise ValueError(f"no REST form for command job fields {sorted(unknown)}")
    environment = job["environment"]
    if isinstance(environment, dict):
        environment = f"<an environment for image {environment.get('image')}, registered at submit>"
    properties: dict[str, Any] = {"displayName": job.get("display_name"), "description": job.get("description"),
                                  "command": _double_brackets(job["command"]), "codeId": job.get("code")}
    compute = job.get("compute")
    if compute:
        properties["computeId"] = compute.removeprefix("azureml:")
    properties.update(properties={}, experimentName=job.get("experiment_name"), isArchived=False,
                      inputs={name: {"uri": spec["path"], "jobInputType": spec["type"]}
                              for name, spec in (job.get("inputs") or {}).items()},
                      outputs={}, environmentId=environment)
    distribution = job.get("distribution")
    if distribution:
        properties["distribution"] = {"processCountPerInstance": int(distribution["process_count_per_instance"]),
                                      "distributionType": _REST_NAMES[distribution["type"].lower()]}
    properties.update(tags=job.get("tags") or {}, environmentVariables=job.get("environment_variables") or {})
    resources = job.get("resources")
    if resources:
        properties["resources"] = {"instanceCount": int(resources["instance_count"]),
                                   **({"instanceType": resources["instance_type"]} if "instance_type" in resources
                                      else {}), "properties": {}}
    timeout = (job.get("limits") or {}).get("timeout")
    if "limits" in job:
        properties["limits"] = {**({"timeout": iso_duration(int(timeout))} if timeout else {}),
                                "jobLimitsType": "Command"}
    if job.get("queue_settings"):
        properties["queueSettings"] = {"jobTier": _REST_NAMES[job["queue_settings"]["job_tier"].lower()]}
    properties["jobType"] = "Command"
    return {"properties": {k: v for k, v in properties.items() if v is not None}, "name": job.get("name")}
