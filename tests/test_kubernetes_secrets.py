"""Kubernetes secrets: variables secret by name or value shape (and secret arguments) reach the nodes through a
Secret the job owns (secretKeyRef), never as values in the job object, the plan or an exported job file; a
resubmitted copy shares the Secret; an account that may not write secrets is refused before anything is created.
Against tests/fakes/kubernetes.py, as tests/test_kubernetes.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from cloudtrain.errors import UserError
from cloudtrain.sdk import Job, plan_job
from tests.conftest import ddp_project
from tests.fakes.kubernetes import STAGED, FakeKube, job, mount_configmaps, node_run, provider

KEY, TOKEN = "wandb-0123456789abcdef0123", "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
SHOW_SECRETS = ("import hashlib, os, sys\n"  # digests: the packager refuses a source file that holds a token
                "def digest(text): return hashlib.sha256(text.encode()).hexdigest()\n"
                "print('got', digest(os.environ.get('WANDB_API_KEY', '')), digest(sys.argv[-1]), flush=True)\n"
                "print('printed', os.environ.get('WANDB_API_KEY'), sys.argv[-1], flush=True)\n")


def digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_secret_variables_reach_the_nodes_through_a_secret_the_job_owns(kube: FakeKube, tmp_path: Path,
                                                                        ct_home: Path) -> None:
    """Secret variables (by name, and a secret argument moved into the environment) go in a Secret the job's env
    reads through secretKeyRef: the TrainJob holds no value, the plan shows none, the Secret is owned by the job (the
    cluster deletes it with the job), a retried submit leaves one Secret, and the node gets the real values."""
    project = tmp_path / "show"
    project.mkdir()
    (project / "show.py").write_text(SHOW_SECRETS)
    p = provider()
    spec = Job(script="show.py", source_dir=str(project), env={"WANDB_API_KEY": KEY, "PLAIN": "visible"},
               args=["--hf-token", TOKEN], **copy.deepcopy(STAGED)).spec
    with plan_job(spec, p, progress=False) as plan:
        body = plan.request["object"]
        printed = json.dumps(plan.to_dict())
        assert KEY not in json.dumps(body) and TOKEN not in json.dumps(body)
        assert KEY not in printed and TOKEN not in printed and "visible" in printed
        env = {e["name"]: e for e in body["spec"]["trainer"]["env"]}
        secret = plan.request["secret"]["metadata"]["name"]
        assert env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": secret, "key": "WANDB_API_KEY"}}}
        assert env["PLAIN"] == {"name": "PLAIN", "value": "visible"}
        moved = [n for n, e in env.items() if n.startswith("CLOUDTRAIN_SECRET_ARG_")]
        assert moved and all("valueFrom" in env[n] for n in moved)
        assert any(f"Secret {secret}" in n for n in plan.notes)
        kube.lose_next_create_reply = True
        handle = p.submit(plan)
        assert p.submit(plan) == handle
    stored = kube.objects[("secrets", "team", secret)]
    assert "stringData" not in stored and set(stored["data"]) == {"WANDB_API_KEY", *moved}
    job_obj = kube.job(handle.job_id)
    assert stored["metadata"]["ownerReferences"] == [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                      "kind": "TrainJob", "name": handle.job_id,
                                                      "uid": job_obj["metadata"]["uid"]}]
    assert KEY not in json.dumps(job_obj) and TOKEN not in json.dumps(job_obj)

    pod = tmp_path / "pod"
    mount_configmaps(kube, "team", plan.request["configmaps"], pod / "parts")
    done = node_run(job_obj, pod, kube=kube)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"got {digest(KEY)} {digest(TOKEN)}" in out, out[-3000:]
    assert "printed **** ****" in out and KEY not in out and TOKEN not in out  # the node's log masks them


def test_a_job_with_secrets_is_refused_before_anything_is_created_when_secrets_are_not_allowed(
        kube: FakeKube, tmp_path: Path, ct_home: Path) -> None:
    kube.denied.add("secrets")
    p = provider()
    with plan_job(job(ddp_project(tmp_path), env={"WANDB_API_KEY": KEY}).spec, p, progress=False) as plan, \
            pytest.raises(UserError, match="may not create and patch secrets") as refused:
        p.submit(plan)
    assert refused.value.field == "env" and "RBAC" in refused.value.remedy
    assert not [k for k in kube.objects if k[0] in ("trainjobs", "secrets", "configmaps")]


def test_a_resubmission_keeps_pod_host_names_short_and_shares_the_secret(kube: FakeKube, tmp_path: Path,
                                                                         ct_home: Path) -> None:
    """The restart name recovery asks for (<root>-rN) is shortened like a first name, so the pods' host names
    stay within 63, the same every time it is asked for (a retried resubmission finds its job); the copy reads
    the first job's Secret and owns it too, so the Secret goes only with the last of them."""
    from cloudtrain.jobs.recovery import restart_name

    p = provider()
    spec = job(ddp_project(tmp_path), name="a-rather-long-experiment-name-for-a-pod", nodes=2,
               env={"HF_TOKEN": TOKEN}).spec
    with plan_job(spec, p, progress=False) as plan:
        handle = p.submit(plan)
    assert len(handle.job_id) + len("-node-0-1") <= 63
    kube.add_pod(handle.job_id, 0, disrupted=True)
    kube.set_condition(handle.job_id, "Failed", "JobSetFailed")
    again = p.resubmit(handle, restart_name(handle.job_id, 1))
    assert p.resubmit(handle, restart_name(handle.job_id, 1)) == again
    assert again.job_id.endswith("-r1") and len(again.job_id) + len("-node-0-1") <= 63, again.job_id
    assert again.job_id[-len("-r1") - 21:-len("-r1")] == handle.job_id[-21:]  # the first one's stamp, kept
    secret = ("secrets", "team", plan.request["secret"]["metadata"]["name"])
    owners = [o["name"] for o in kube.objects[secret]["metadata"]["ownerReferences"]]
    assert owners == [handle.job_id, again.job_id]
    del kube.objects[("trainjobs", "team", handle.job_id)]
    kube.collect_garbage()
    assert secret in kube.objects  # the copy still reads it
    del kube.objects[("trainjobs", "team", again.job_id)]
    kube.collect_garbage()
    assert secret not in kube.objects


def test_export_keeps_secret_values_out_of_the_job_file(tmp_path: Path, ct_home: Path) -> None:
    from cloudtrain.plan.export import export

    with plan_job(job(ddp_project(tmp_path), env={"WANDB_API_KEY": KEY}).spec, provider(), progress=False) as plan:
        export(plan, tmp_path / "out")
    out = tmp_path / "out"
    assert KEY not in (out / "trainjob.yaml").read_text()
    secret = yaml.safe_load((out / "secret.yaml").read_text())
    assert secret["kind"] == "Secret" and secret["stringData"]["WANDB_API_KEY"] == KEY
    assert (out / "secret.yaml").stat().st_mode & 0o077 == 0
    readme = (out / "README.md").read_text()
    assert readme.index("kubectl apply -f secret.yaml") < readme.index("kubectl apply -f trainjob.yaml")
