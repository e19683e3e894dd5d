from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloudtrain.errors import SpecError
from cloudtrain.spec.model import (
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
        ({"script": "t.py", "procs_per_node": 0}, "procs_per_node: must be between 1 and 256"),
        ({"script": "t.py", "strategy": "zero3"}, "strategy:"),
        ({"script": "t.py", "max_runtime": "forever"}, "max_runtime: 'forever' is not a duration"),
        ({"script": "t.py", "checkpoint": {"uri": "/tmp/ckpt"}}, "checkpoint.uri: '/tmp/ckpt' is not a storage URI"),
        ({"script": "t.py", "checkpoint": {"keep": 1}}, "checkpoint.keep"),
        ({"script": "t.py", "module": "m"}, "exactly one of 'script'"),
        ({}, "exactly one of 'script'"),
        ({"script": "t.py", "max_wait": "1h"}, "max_wait applies to spot jobs only"),
        ({"script": "t.py", "spot": True, "max_wait": "1h", "max_runtime": "2h"}, "max_wait (3600s) must be >="),
        ({"script": "t.py", "name": "Bad_Name"}, "name:"),
        ({"script": "t.py", "inputs": {"train data": "s3://bkt/x"}}, "input name 'train data'"),
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
    spec = load_spec(spec_file, {"nodes": 3, "checkpoint.uri": "s3://bkt/run"})
    assert spec.source_dir == str((tmp_path / "proj" / "code").resolve())
    assert (spec.nodes, spec.max_runtime, spec.checkpoint.uri) == (3, 7200, "s3://bkt/run")


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


# -- hostile input (issue 15, items 13 and 14): refused when the spec is read, naming the field and the fix -----------


@pytest.mark.parametrize("procs", [0, -1, "00", "-1", 100_000, "100000", "1e3", "", "two", True])
def test_procs_per_node_is_a_sane_count(procs: object) -> None:
    with pytest.raises(SpecError, match=r"procs_per_node: must (be between 1 and 256|be a whole number)"):
        validate_spec({"script": "t.py", "procs_per_node": procs})


@pytest.mark.parametrize(("procs", "count"), [("auto", "auto"), (" 4 ", 4), ("+2", 2), (256, 256)])
def test_procs_per_node_accepts(procs: object, count: object) -> None:
    assert validate_spec({"script": "t.py", "procs_per_node": procs}).procs_per_node == count


@pytest.mark.parametrize("text", ["1d99999999999999999999h", "9" * 25, 10**30, "366d", "9" * 5000])
def test_absurd_durations_are_refused(text: object) -> None:
    with pytest.raises(SpecError, match=r"max_runtime: .*(more than a year|is not a duration)"):
        validate_spec({"script": "t.py", "max_runtime": text})


@pytest.mark.parametrize(
    ("uri", "expected"),
    [("s3://", "names no bucket"), ("s3:///x", "names no bucket"), ("gs://", "names no bucket"),
     ("az://", "names no container"), ("file://relative", "names a host ('relative')"),
     ("file:///", "is not an absolute folder below '/'"), ("file://", "is not an absolute folder"),
     ("file:///a/../b", "contains '..'"), ("file:///a%00b", "is not an absolute folder"),
     ("s3://b/x", "'b' in 's3://b/x' is not a valid name"), ("gs://Bucket/x", "is not a valid name"),
     ("s3://bkt/x?versionId=1", "'?' or '#'"), ("s3://bkt/a\nb", "control characters"),
     ("abfs://c@account.blob.core.windows.net/x", "container@account.dfs.core.windows.net"),
     ("/tmp/ckpt", "is not a storage URI")],
)
def test_storage_uris_are_checked_when_the_spec_is_read(uri: str, expected: str) -> None:
    for raw in ({"checkpoint": {"uri": uri}}, {"output_uri": uri}, {"inputs": {"train": uri}},
                {"providers": {"local": {"store_uri": uri}}}):
        with pytest.raises(SpecError) as info:
            validate_spec({"script": "t.py", **raw})
        assert expected in str(info.value) and "fix:" in str(info.value)


@pytest.mark.parametrize("uri", ["s3://my-bucket/runs/a", "gs://my.bucket_1/x", "az://my-container/x", "az://$root/x",
                                 "abfss://data@acct123.dfs.core.windows.net/x", "file:///tmp/ckpt",
                                 "file://localhost/tmp/ckpt"])
def test_good_storage_uris_pass(uri: str) -> None:
    assert validate_spec({"script": "t.py", "checkpoint": {"uri": uri}}).checkpoint.uri == uri


def test_staging_buckets_are_names_not_uris() -> None:
    with pytest.raises(SpecError, match=re.escape("providers.aws.bucket: 's3://x' is not a valid bucket name")):
        validate_spec({"script": "t.py", "providers": {"aws": {"bucket": "s3://x"}}})
    with pytest.raises(SpecError, match=re.escape("providers.gcp.bucket")):
        validate_spec({"script": "t.py", "providers": {"gcp": {"bucket": "Has Space"}}})


@pytest.mark.parametrize(("provider", "region"), [("gcp", "xx"), ("gcp", "us-central1-a"), ("gcp", "US-CENTRAL1"),
                                                ("aws", "xx"), ("aws", "us-east"), ("aws", "useast1")])
def test_regions_are_checked_for_shape(provider: str, region: str) -> None:
    with pytest.raises(SpecError, match=re.escape(f"providers.{provider}.region: {region!r} is not")):
        validate_spec({"script": "t.py", "providers": {provider: {"region": region}}})


@pytest.mark.parametrize(("provider", "region"), [("gcp", "us-central1"), ("gcp", "northamerica-northeast1"),
                                                ("aws", "us-east-1"), ("aws", "us-gov-west-1"), ("aws", "cn-north-1")])
def test_real_regions_pass(provider: str, region: str) -> None:
    spec = validate_spec({"script": "t.py", "providers": {provider: {"region": region}}})
    assert getattr(spec.providers, provider).region == region


@pytest.mark.parametrize(
    ("raw", "field"),
    [({"env": {"A": "x\0y"}}, "env.A"), ({"args": ["ok", "a\0b"]}, "args[1]"), ({"name": "a\0b"}, "name"),
     ({"tags": {"t\0": "v"}}, "tags.t\\x00"), ({"source_dir": "/tmp\0"}, "source_dir"),
     ({"env": {"A": "\ud800"}}, "env.A")],
)
def test_nul_bytes_and_broken_unicode_are_refused_by_field(raw: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec({"script": "t.py", **raw})
    assert str(info.value).startswith(f"{field}: ") and "fix:" in str(info.value)


def test_a_trailing_newline_does_not_slip_through_a_name_check() -> None:
    with pytest.raises(SpecError, match="environment variable name 'A\\\\n'"):
        validate_spec({"script": "t.py", "env": {"A\n": "x"}})
    with pytest.raises(SpecError, match="input name 'train\\\\n'"):
        validate_spec({"script": "t.py", "inputs": {"train\n": "s3://bkt/x"}})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("script: t.py\nnodes: 1\nnodes: 2\n", "key 'nodes' is given twice (first at line 2)"),
     ("script: t.py\nenv:\n  A: 1\n  A: 2\n", "key 'A' is given twice"),
     ("script: t.py\nargs: " + "[" * 20_000 + "\n", "nests values too deeply"),
     ("script: t.py\nargs: " + "[" * 40 + "]" * 40 + "\n", "more than 32 levels deep"),
     ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
      "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
      "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n", "more than 100000 values")],
)
def test_spec_files_that_yaml_would_misread_or_choke_on(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "cloudtrain.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=re.escape(expected)):
        load_spec(path)


def test_an_oversized_or_unreadable_spec_file(tmp_path: Path) -> None:
    big = tmp_path / "cloudtrain.yaml"
    big.write_text("script: t.py\n" + "# padding\n" * 200_000)
    with pytest.raises(SpecError, match="a job spec is a few KB"):
        load_spec(big)
    with pytest.raises(SpecError, match="-f/--file: "):  # a NUL byte in a path: not a ValueError traceback
        load_spec(tmp_path / "a\0b.yaml")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [({"script": "../outside.py"}, "script: script '../outside.py' is outside source_dir"),
     ({"script": "/etc/hostname"}, "script: script '/etc/hostname' is outside source_dir"),
     ({"script": "train.py", "requirements": "../req.txt"}, "requirements: requirements file '../req.txt' is outside"),
     ({"script": "link.py"}, "is outside source_dir"),
     ({"script": "loop.py"}, "cannot be resolved")],
)
def test_script_and_requirements_stay_inside_source_dir(tmp_path: Path, raw: dict, expected: str) -> None:
    from cloudtrain.spec.model import check_local_paths

    source = tmp_path / "proj"
    source.mkdir()
    (source / "train.py").write_text("print(1)\n")
    (tmp_path / "outside.py").write_text("print(1)\n")
    (tmp_path / "req.txt").write_text("numpy\n")
    (source / "link.py").symlink_to(tmp_path / "outside.py")
    (source / "loop.py").symlink_to(source / "loop.py")
    with pytest.raises(SpecError, match=re.escape(expected)):
        check_local_paths(validate_spec({**raw, "source_dir": str(source)}))
