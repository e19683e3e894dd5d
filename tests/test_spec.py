from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.errors import SpecError
from cloudtrain.spec import (
    JobSpec,
    apply_overrides,
    json_schema,
    load_spec,
    parse_duration,
    project_options,
    validate_spec,
)


def test_minimal_spec_fills_defaults_and_derives_name() -> None:
    spec = validate_spec({"script": "My_Train.py"})
    assert spec.name == "my-train"
    assert (spec.nodes, spec.nproc_per_node, spec.world_size, spec.strategy) == (1, 1, 1, "ddp")


@pytest.mark.parametrize(("text", "seconds"), [(90, 90), ("90", 90), ("30m", 1800), ("2h", 7200), ("1d12h", 129600)])
def test_durations(text: object, seconds: int) -> None:
    assert parse_duration(text) == seconds


def test_accelerator_drives_procs_per_node() -> None:
    spec = validate_spec({"script": "t.py", "accelerator": "A100:8", "nodes": 2})
    assert (spec.gpus_per_node, spec.accelerator_model, spec.nproc_per_node, spec.world_size) == (8, "A100", 8, 16)
    assert validate_spec({"script": "t.py", "accelerator": "A100:8", "procs_per_node": 2}).nproc_per_node == 2


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"script": "t.py", "nodez": 2}, "nodez: unknown key; did you mean 'nodes'?"),
        ({"script": "t.py", "checkpoint": {"kep": 3}}, "checkpoint.kep: unknown key; did you mean 'keep'?"),
        ({"script": "t.py", "providers": {"aws": {"regoin": "x"}}}, "providers.aws.regoin: unknown key"),
        ({"script": "t.py", "nodes": 0}, "nodes: must be >= 1 (got 0)"),
        ({"script": "t.py", "procs_per_node": 0}, "procs_per_node: must be >= 1"),
        ({"script": "t.py", "strategy": "zero3"}, "strategy:"),
        ({"script": "t.py", "max_runtime": "forever"}, "max_runtime: 'forever' is not a duration"),
        ({"script": "t.py", "checkpoint": {"uri": "/tmp/ckpt"}}, "checkpoint.uri: '/tmp/ckpt' is not a storage URI"),
        ({"script": "t.py", "checkpoint": {"keep": 1}}, "checkpoint.keep"),
        ({"script": "t.py", "module": "m"}, "exactly one of 'script'"),
        ({}, "exactly one of 'script'"),
        ({"script": "t.py", "max_wait": "1h"}, "max_wait applies to spot jobs only"),
        ({"script": "t.py", "spot": True, "max_wait": "1h", "max_runtime": "2h"}, "max_wait (3600s) must be >="),
        ({"script": "t.py", "name": "Bad_Name"}, "name:"),
        ({"script": "t.py", "inputs": {"train data": "s3://b/x"}}, "input name 'train data'"),
        ({"script": "t.py", "env": {"1BAD": "x"}}, "environment variable name '1BAD'"),
    ],
)
def test_invalid_specs_name_the_field(raw: dict, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(raw)
    assert expected in str(info.value)
    assert info.value.exit_code == 2


def test_yaml_file_resolves_source_dir_relative_to_file(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    spec_file = tmp_path / "proj" / "cloudtrain.yaml"
    spec_file.write_text("script: train.py\nsource_dir: code\nnodes: 2\nmax_runtime: 2h\n")
    spec = load_spec(spec_file, {"nodes": 3, "checkpoint.uri": "s3://b/run"})
    assert spec.source_dir == str((tmp_path / "proj" / "code").resolve())
    assert (spec.nodes, spec.max_runtime, spec.checkpoint.uri) == (3, 7200, "s3://b/run")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("nodes: [1,\n", "is not valid YAML at line"), ("- a\n- b\n", "must hold a mapping"),
     ("a: b: c\n", "not valid YAML")],
)
def test_malformed_yaml(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "cloudtrain.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=expected):
        load_spec(path)


def test_overrides_do_not_mutate_the_input() -> None:
    raw = {"checkpoint": {"keep": 3}}
    merged = apply_overrides(raw, {"checkpoint.uri": "gs://b/c", "nodes": None})
    assert raw == {"checkpoint": {"keep": 3}}
    assert merged == {"checkpoint": {"keep": 3, "uri": "gs://b/c"}}


def test_schema_forbids_unknown_keys_everywhere() -> None:
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert set(JobSpec.model_fields) == set(schema["properties"])
    for name, sub in schema["$defs"].items():
        assert sub.get("additionalProperties") is False, name
    # durations accept strings as well as seconds
    assert schema["properties"]["max_runtime"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]


def test_project_options_reads_the_provider_block_of_the_spec_here(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert project_options("aws") == {}  # no cloudtrain.yaml here
    (tmp_path / "cloudtrain.yaml").write_text("script: t.py\nproviders:\n  aws: {region: eu-west-1}\n")
    assert project_options("aws") == {"region": "eu-west-1"}
    assert project_options("gcp") == {}
    (tmp_path / "cloudtrain.yaml").write_text("script: t.py\nproviders: [aws]\n")  # malformed: nothing, no crash
    assert project_options("aws") == {}
