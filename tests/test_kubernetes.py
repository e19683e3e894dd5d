"""The kubernetes provider: plans checked against the vendored Kubeflow CRDs (and refused with the field and the fix),
the CRDs' CEL rules (cel-python) against schema.py's twins, submit/status/logs/cancel/resubmit through the official
client against tests/fakes/kubernetes.py, export, doctor, and the node contract (the conformance suite and the emulated
2x2 gloo job are in tests/test_conformance.py and here)."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.errors import SpecError, UserError
from cloudtrain.job_types import JobState
from cloudtrain.providers.kubernetes import node, schema
from cloudtrain.sdk import Job, plan_job
from tests.conftest import REPO, ddp_project
from tests.fakes.kubernetes import STAGED, FakeKube, _cel, job, mount_configmaps, node_run, provider


def test_plan_is_a_trainjob_the_crd_accepts(tmp_path: Path, ct_home: Path) -> None:
    project = ddp_project(tmp_path)
    spec = job(project, nodes=3, accelerator="A100:8", max_runtime="2h", max_restarts=2,
               providers={"kubernetes": {"staging": "s3://bucket/ct", "queue": "gpu-queue", "namespace": "team"}}).spec
    with plan_job(spec, provider(), progress=False) as plan:
        body = plan.request["object"]
        assert schema.problems(body) == [] and _cel("TrainJob", body) == [] and schema.jsonschema_errors(body) == []
        assert body["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and body["kind"] == "TrainJob"
        trainer = body["spec"]["trainer"]
        assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 8
        assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 8}
        assert body["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                              "kind": "ClusterTrainingRuntime"}
        assert body["spec"]["activeDeadlineSeconds"] == 7200
        assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert not {e["name"] for e in trainer["env"]} & set(node.RESERVED)
        command = trainer["command"]
        assert command[0] == "python3" and command[1] == "-c" and command[3].startswith("s3://bucket/ct/bundles/")
        pod = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
            "template"]["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 120
        assert any("failurePolicy.maxRestarts" in n for n in plan.notes)
        line = plan.nodes[2].torchrun
        assert line[line.index("--node-rank") + 1] == "2" and line[line.index("--nnodes") + 1] == "3"
        assert f"{plan.job_id}-node-0-0.{plan.job_id}" in " ".join(line)


def test_plan_pytorchjob(tmp_path: Path, ct_home: Path) -> None:
    project = ddp_project(tmp_path)
    spec = job(project, nodes=3, procs_per_node=2, max_restarts=4,
               providers={"kubernetes": {**STAGED["providers"]["kubernetes"], "api": "pytorchjob"}}).spec
    with plan_job(spec, provider(), progress=False) as plan:
        body = plan.request["object"]
        assert body["kind"] == "PyTorchJob" and schema.problems(body) == [] and _cel("PyTorchJob", body) == []
        assert schema.jsonschema_errors(body) == []
        specs = body["spec"]["pytorchReplicaSpecs"]
        assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
        assert body["spec"]["runPolicy"]["backoffLimit"] == 4 and body["spec"]["nprocPerNode"] == "2"
        line = plan.nodes[1].torchrun
        assert f"{plan.job_id}-master-0" in " ".join(line) and "23456" in " ".join(line)


@pytest.mark.parametrize(("env", "api"), [("PET_NODE_RANK", "trainjob"), ("PET_MASTER_ADDR", "trainjob"),
                                          ("WORLD_SIZE", "pytorchjob")])
def test_reserved_env_is_refused_at_plan_time(tmp_path: Path, ct_home: Path, cli: Callable[..., Any],
                                              env: str, api: str) -> None:
    project = ddp_project(tmp_path)
    done = cli("plan", "train_ddp.py", "-p", "kubernetes", "--env", f"{env}=1", "--set",
               f"providers.kubernetes.api={api}", cwd=project)
    assert done.returncode == 2 and f"env.{env}" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_names_are_fixed_for_rfc1035_and_the_pods_host_names(tmp_path: Path, ct_home: Path) -> None:
    from cloudtrain.providers.kubernetes.provider import job_name

    fixed, notes = job_name("9lives-20260101-120000-abcd", "trainjob", 2)
    assert fixed == "j-9lives-20260101-120000-abcd" and notes
    long = "a" * 40 + "-20260101-120000-abcd"
    fixed, _ = job_name(long, "trainjob", 100)
    assert len(fixed) + len("-node-0-99") <= 63 and fixed.endswith("-20260101-120000-abcd")
    assert schema.RFC1035.match(fixed)
    project = ddp_project(tmp_path)
    with plan_job(job(project, name="a" * 40, nodes=16).spec, provider(), progress=False) as plan:
        assert len(plan.job_id) + len("-node-0-15") <= 63


@pytest.mark.parametrize(("path", "value", "field"), [
    (("spec", "trainer", "numNodes"), "two", "spec.trainer.numNodes"),
    (("spec", "trainer", "numProcPerNode"), "auto", "spec.trainer.numProcPerNode"),
    (("spec", "activeDeadlineSeconds"), 0, "spec.activeDeadlineSeconds"),
    (("spec", "trainer", "nodes"), 2, "spec.trainer.nodes"),
    (("metadata", "name"), "1-bad", "metadata.name"),
    (("metadata", "name"), "a" * 64, "metadata.name"),
    (("spec", "managedBy"), "someone/else", "spec.managedBy"),
])
def test_a_refused_trainjob_names_the_field_and_the_fix(tmp_path: Path, ct_home: Path, path: tuple[str, ...],
                                                        value: Any, field: str) -> None:
    with plan_job(job(ddp_project(tmp_path)).spec, provider(), progress=False) as plan:
        body = copy.deepcopy(plan.request["object"])
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpecError) as refused:
        schema.check(body)
    assert field in (refused.value.field or ""), refused.value
    assert refused.value.remedy
    assert any(field == where for where, _ in [*schema.problems(body)])
    # jsonschema (the fake API server's check) refuses the same field
    assert {w for w, _ in schema.jsonschema_errors(body)} == {w for w, _ in schema.schema_errors(body)}
    assert any(field == where for where, _ in _cel("TrainJob", body)) or path[0] != "metadata"  # cel-python agrees


def test_cel_twins_agree_with_cel_python_and_cover_every_create_rule() -> None:
    import celpy

    env = celpy.Environment()
    for kind in ("TrainJob", "PyTorchJob"):  # what plans send (the fake evaluates every rule with cel-python)
        for _path, rule in schema.create_rules(kind):
            assert rule["rule"] in schema.CEL_TWINS, f"{kind}: no twin for CEL rule {rule['rule']!r}"
    samples: dict[str, list[Any]] = {
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')":
            [{"metadata": {"name": n}} for n in ("a", "ab-1", "1a", "a-", "A", "a.b", "a" * 70)],
        "size(self.metadata.name) <= 63": [{"metadata": {"name": "a" * n}} for n in (1, 63, 64)],
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": ["", "hf://x", "s3://b/k", "x", "1s://b"],
        "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']":
            ["kueue.x-k8s.io/multikueue", "trainer.kubeflow.org/trainjob-controller", "other"],
        "has(self.lastUpdatedTime)": [{"lastUpdatedTime": "x"}, {}],
    }
    for rule, values in samples.items():
        program = env.program(env.compile(rule))
        for value in values:
            assert bool(program.evaluate({"self": celpy.json_to_cel(value)})) == schema.CEL_TWINS[rule](value), \
                (rule, value)


def test_node_contract_reads_pet_variables() -> None:
    seen = node.detect({**node.planned(4, 3, "job-a"), "PET_NPROC_PER_NODE": "8"})
    assert seen == {"nnodes": 4, "node_rank": 3, "master_addr": "job-a-node-0-0.job-a", "master_port": 29500,
                    "rdzv": "static"}
    seen = node.detect(node.pytorchjob_env(3, 2, "job-b", 2))
    assert seen["master_addr"] == "job-b-master-0" and seen["master_port"] == 23456 and seen["node_rank"] == 2
    with pytest.raises(ValueError, match="PET_NNODES"):
        node.detect({})


# -- against the fake API server -----------------------------------------------------------------------------------
def test_submit_stages_configmaps_and_creates_one_trainjob(kube: FakeKube, tmp_path: Path, ct_home: Path) -> None:
    p = provider()
    with plan_job(job(ddp_project(tmp_path), nodes=2).spec, p, progress=False) as plan:
        handle = p.submit(plan)
        assert str(handle) == f"kubernetes://team/{plan.job_id}"  # the namespace from the options
        parts = plan.request["configmaps"]
    assert ("configmaps", "team", parts[0]) in kube.objects
    stored = kube.objects[("configmaps", "team", parts[0])]
    assert "bootstrap.py" in stored["data"] and stored["immutable"] is True
    assert [k for k in kube.objects if k[0] == "trainjobs"] == [("trainjobs", "team", handle.job_id)]
    assert p.describe(handle).state is JobState.PENDING
    kube.add_pod(handle.job_id, 0, "hello from node 0\n")
    kube.add_pod(handle.job_id, 1, "hello from node 1\npartial")
    assert p.describe(handle).state is JobState.RUNNING
    kube.set_condition(handle.job_id, "Complete", "JobSetCompleted")
    lines = list(p.logs(handle, follow=True))
    assert lines == ["[node-0] hello from node 0", "[node-1] hello from node 1", "[node-1] partial"]
    assert [s.handle for s in p.list()] == [handle]


def test_queued_by_kueue_then_preempted_then_resubmitted(kube: FakeKube, tmp_path: Path, ct_home: Path) -> None:
    p = provider()
    spec = job(ddp_project(tmp_path), providers={"kubernetes": {**STAGED["providers"]["kubernetes"],
                                                                "queue": "gpus"}}).spec
    with plan_job(spec, p, progress=False) as plan:
        handle = p.submit(plan)
    status = p.describe(handle)
    assert status.state is JobState.PENDING and "Kueue" in status.message
    kube.add_pod(handle.job_id, 0, disrupted=True)
    kube.set_condition(handle.job_id, "Failed", "JobSetFailed")
    assert p.describe(handle).state is JobState.PREEMPTED
    again = p.resubmit(handle, f"{handle.job_id[:50]}-r1")
    assert p.resubmit(handle, f"{handle.job_id[:50]}-r1") == again
    copied = kube.job(again.job_id)
    assert copied["spec"]["trainer"] == kube.job(handle.job_id)["spec"]["trainer"]
    assert copied["metadata"]["annotations"]["cloudtrain.dev/resubmit-of"] == handle.job_id


def test_cancel_suspends_and_marks(kube: FakeKube, tmp_path: Path, ct_home: Path) -> None:
    p = provider()
    spec = job(ddp_project(tmp_path), providers={"kubernetes": {**STAGED["providers"]["kubernetes"],
                                                                "api": "pytorchjob"}}).spec
    with plan_job(spec, p, progress=False) as plan:
        handle = p.submit(plan)
    kube.add_pod(handle.job_id, 0, "x\n")
    kube.set_condition(handle.job_id, "Running", "PyTorchJobRunning")
    assert p.cancel(handle).state is JobState.CANCELLED
    obj = kube.job(handle.job_id)
    assert obj["spec"]["runPolicy"]["suspend"] is True
    assert obj["metadata"]["annotations"]["cloudtrain.dev/cancelled"] == "true"


def test_missing_namespace_and_runtime_are_clear_errors(kube: FakeKube, tmp_path: Path, ct_home: Path) -> None:
    p = provider()
    project = ddp_project(tmp_path)
    spec = job(project, providers={"kubernetes": {"staging": "pvc://shared/x", "namespace": "nope"}}).spec
    with plan_job(spec, p, progress=False) as plan, pytest.raises(UserError) as refused:
        p.submit(plan)
    assert "nope" in refused.value.message and "not found" in refused.value.message
    spec = job(project, providers={"kubernetes": {**STAGED["providers"]["kubernetes"], "runtime": "no-such"}},
               env={"WANDB_API_KEY": "wandb-0123456789abcdef0123"}).spec
    with plan_job(spec, provider(), progress=False) as plan, pytest.raises(SpecError) as refused:
        provider().submit(plan)
    assert refused.value.field == "spec.runtimeRef" and "must be created" in refused.value.message
    assert not [k for k in kube.objects if k[0] == "secrets"]  # the refused job's Secret does not outlive it


def test_submit_refuses_the_staging_placeholder(tmp_path: Path, ct_home: Path) -> None:
    with plan_job(Job(script="train_ddp.py", source_dir=str(ddp_project(tmp_path))).spec, provider(),
                  progress=False) as plan:
        assert any("staging is not set" in n for n in plan.notes)
        with pytest.raises(UserError, match=r"providers\.kubernetes\.staging"):
            provider().submit(plan)


def test_export_writes_the_trainjob_and_a_readme(tmp_path: Path, ct_home: Path) -> None:
    from cloudtrain.plan.export import export

    with plan_job(job(ddp_project(tmp_path), nodes=2).spec, provider(), progress=False) as plan:
        written = export(plan, tmp_path / "out")
    names = {p.name for p in written}
    assert {"trainjob.yaml", "configmaps.yaml", "README.md"} <= names
    docs = list(yaml.safe_load_all((tmp_path / "out" / "trainjob.yaml").read_text()))
    assert docs[0]["kind"] == "TrainJob" and schema.problems(docs[0]) == []
    assert "kubectl apply -f" in (tmp_path / "out" / "README.md").read_text()


def test_doctor_checks_context_namespace_runtime_and_staging(kube: FakeKube, tmp_path: Path, ct_home: Path,
                                                             cli: Callable[..., Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_KUBERNETES_STAGING", "pvc://shared/ct")
    done = cli("doctor", "-p", "kubernetes", "-o", "json")
    checks = {c["name"]: c for c in json.loads(done.stdout) if c["area"] == "kubernetes"}
    assert checks["context"]["status"] == "ok" and "fake" in checks["context"]["detail"]
    assert checks["namespace"]["status"] == "ok" and "team" in checks["namespace"]["detail"]
    assert checks["runtime"]["status"] == "ok" and "torch-distributed" in checks["runtime"]["detail"]
    assert checks["staging"]["status"] == "ok"
    (tmp_path / "cloudtrain.yaml").write_text("script: train.py\nmax_restarts: 2\n")  # the runtime restarts 0 times
    kube.denied.add("secrets")
    checks = {c["name"]: c for c in json.loads(cli("doctor", "-p", "kubernetes", "-o", "json").stdout)
              if c["area"] == "kubernetes"}
    assert checks["runtime"]["status"] == "warn" and "max_restarts 2" in checks["runtime"]["detail"], checks
    assert "wait --recover" in checks["runtime"]["fix"]
    assert checks["namespace"]["status"] == "warn" and "secrets" in checks["namespace"]["detail"], checks
    monkeypatch.setenv("CLOUDTRAIN_KUBERNETES_RUNTIME", "no-such")
    kube.denied.add("trainjobs")
    checks = {c["name"]: c for c in json.loads(cli("doctor", "-p", "kubernetes", "-o", "json").stdout)
              if c["area"] == "kubernetes"}
    assert checks["runtime"]["status"] == "missing" and checks["namespace"]["status"] == "missing"


@pytest.mark.slow
def test_emulated_kubernetes_nodes_run_a_2x2_gloo_job(tmp_path: Path, ct_home: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "plain_torchrun.py").write_text((REPO / "entrypoints" / "plain_torchrun.py").read_text())
    run = Job(script="plain_torchrun.py", source_dir=str(project), nodes=2, procs_per_node=2,
              providers={"local": {"emulate": "kubernetes"}}).submit("local")
    status = run.wait(timeout=240, poll=0.5, progress=False)
    logs = "\n".join(run.logs())
    assert status.state is JobState.SUCCEEDED, logs[-3000:]
    assert "all_reduce ok: True world_size=4" in logs


# -- the node's first step (fetch.py) against what submit staged -----------------------------------------------------
HELLO = "import os, sys\nprint('hello from the fetched bundle', os.environ.get('PET_NODE_RANK'), flush=True)\n"


def hello_project(root: Path) -> Path:
    project = root / "hello"
    project.mkdir()
    (project / "hello.py").write_text(HELLO)
    return project


def sha256(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_node_fetch_joins_the_configmap_parts_and_refuses_a_corrupt_one(kube: FakeKube, tmp_path: Path,
                                                                         ct_home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.providers.kubernetes import request as rq

    monkeypatch.setattr(rq, "PART_BYTES", 16 * 1024)  # several parts: their order matters
    p = provider()
    with plan_job(Job(script="hello.py", source_dir=str(hello_project(tmp_path)), **copy.deepcopy(STAGED)).spec,
                  p, progress=False) as plan:
        parts, digest = plan.request["configmaps"], plan.package.digest
        assert len(parts) > 2
        p.submit(plan)
        expected = plan.package.path.read_bytes()
    body = kube.job(plan.job_id)
    trainer = body["spec"]["trainer"]
    assert trainer["command"][3] == f"parts:{rq.PARTS_DIR}" and trainer["command"][4] == rq.BUNDLE_DIR
    assert f"{rq.BUNDLE_DIR}/bundle.tar.gz" in trainer["command"] and digest in trainer["command"]

    good = tmp_path / "pod-good"
    mount_configmaps(kube, "team", parts, good / "parts")
    done = node_run(body, good)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    fetched = good / "bundle" / "bundle.tar.gz"
    assert sha256(fetched) == digest and fetched.read_bytes() == expected
    assert (good / "bundle" / "bootstrap.py").read_bytes() == plan.package.bootstrap.read_bytes()
    assert not (good / "bundle" / "fetching").exists() or not any((good / "bundle" / "fetching").iterdir())
    assert f"cloudtrain fetch: parts:{good}/parts -> {good}/bundle" in done.stdout
    assert "hello from the fetched bundle 0" in done.stdout + done.stderr

    bad = tmp_path / "pod-bad"
    mount_configmaps(kube, "team", parts, bad / "parts")
    target = (bad / "parts" / "bundle.part-001").resolve()
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    done = node_run(body, bad)
    assert done.returncode != 0
    assert "does not match" in done.stderr and digest in done.stderr, done.stderr[-3000:]
    assert "hello from the fetched bundle" not in done.stdout + done.stderr
    assert not (bad / "bundle" / "bundle.tar.gz").exists()  # a restarted container fetches again


def test_node_fetch_from_s3_staging(kube: FakeKube, tmp_path: Path, ct_home: Path, emulators: Any,
                                    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """providers.kubernetes.staging s3://: submit stages the bundle under the plan's prefix (moto), the TrainJob's
    node command fetches it from there (the image's boto3: this venv has fsspec without s3fs, like the PyTorch image),
    and an image with neither says what to install."""
    import boto3

    from cloudtrain.providers.kubernetes import request as rq
    from tests.emulators import BUCKET, ensure, root_uri

    ensure("s3", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    staging = root_uri("s3", tmp_path)
    p = provider()
    spec = Job(script="hello.py", source_dir=str(hello_project(tmp_path)),
               providers={"kubernetes": {"staging": staging, "namespace": "team"}}).spec
    with plan_job(spec, p, progress=False) as plan:
        digest, prefix = plan.package.digest, plan.staging["prefix"]
        assert prefix == f"{staging}/bundles/{digest.split(':', 1)[1]}" and not plan.request["configmaps"]
        p.submit(plan)
        expected = plan.package.path.read_bytes()
    key = prefix[len(f"s3://{BUCKET}/"):]
    s3 = boto3.client("s3")
    staged = s3.get_object(Bucket=BUCKET, Key=f"{key}/bundle.tar.gz")["Body"].read()
    import hashlib

    assert "sha256:" + hashlib.sha256(staged).hexdigest() == digest and staged == expected
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=f"{key}/manifest.json")["Body"].read())["digest"] == digest
    assert not [k for k in kube.objects if k[0] == "configmaps"]
    body = kube.job(plan.job_id)
    command = body["spec"]["trainer"]["command"]
    assert command[3] == prefix and command[4] == rq.BUNDLE_DIR and digest in command
    assert not any(m.get("name") == "cloudtrain-parts" for m in body["spec"]["runtimePatches"][0][
        "trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["volumeMounts"])

    pod = tmp_path / "pod"
    done = node_run(body, pod)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sha256(pod / "bundle" / "bundle.tar.gz") == digest
    assert (pod / "bundle" / "bootstrap.py").read_bytes() == plan.package.bootstrap.read_bytes()
    assert f"cloudtrain fetch: {prefix} -> {pod}/bundle" in done.stdout
    assert "hello from the fetched bundle 0" in done.stdout + done.stderr

    bare = tmp_path / "pod-bare"  # python3 with the standard library only (-S: no site-packages)
    done = node_run(body, bare, python=[sys.executable, "-S"])
    assert done.returncode != 0 and "the image cannot read" in done.stderr and "boto3" in done.stderr, done.stderr
    assert not (bare / "bundle" / "bundle.tar.gz").exists()

    s3.put_object(Bucket=BUCKET, Key=f"{key}/bundle.tar.gz", Body=staged[:-10])  # truncated in the store
    cut = tmp_path / "pod-cut"
    done = node_run(body, cut)
    assert done.returncode != 0 and "does not match" in done.stderr and digest in done.stderr, done.stderr[-3000:]
    assert not (cut / "bundle" / "bundle.tar.gz").exists()
