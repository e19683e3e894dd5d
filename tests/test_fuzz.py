"""Hostile input, generated: the spec loader and the CLI never show a traceback; bad input always exits 2."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.cli.main import main
from cloudtrain.errors import SpecError
from cloudtrain.spec.model import JobSpec, load_spec

pytestmark = pytest.mark.soak  # `nox -s soak`: ~150 generated cases per test
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
keys = st.sampled_from([*JobSpec.model_fields, "nodez", "checkpoint.uri", ""]) | st.text(max_size=12)
scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=30)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=12)


@pytest.fixture(autouse=True, scope="module")
def _isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("CLOUDTRAIN_HOME")
    os.environ["CLOUDTRAIN_HOME"] = str(tmp_path_factory.mktemp("fuzz-home"))
    yield
    if old is None:
        os.environ.pop("CLOUDTRAIN_HOME")
    else:
        os.environ["CLOUDTRAIN_HOME"] = old


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@SETTINGS
@given(doc=st.dictionaries(keys, values, max_size=8))
def test_any_yaml_mapping_loads_or_fails_cleanly(tmp_path_factory, doc: dict) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "cloudtrain.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        load_spec(path)
    except SpecError as exc:
        assert exc.exit_code == 2 and str(exc)


@SETTINGS
@given(text=st.text(max_size=200))
def test_any_text_as_spec_file_fails_cleanly(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "cloudtrain.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))
    try:
        load_spec(path)
    except SpecError as exc:
        assert exc.exit_code == 2


flag_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
# What a fuzzer throws at a value: text in any script (NUL and controls included), huge and negative numbers, the
# empty string, YAML structure, URIs with a scheme and nothing else, durations with absurd parts.
hostile = (flag_values | st.text(max_size=20).map(lambda t: t + "\0" + t) | st.just("")
           | st.integers(-10**30, 10**30).map(str) | st.sampled_from(
               ["[" * 200, "{a: 1, a: 2}", "&a [*a]", "s3://", "gs:///x", "file://x", "file:///", "az://", "0", "-1",
                "00", "1e9", "nan", "inf", "1d99999999999999999999h", "99999999999999999999s", "auto", "A100:0",
                "A100:99999999999999999999", "~", "null", "true", "\u202e", "\ufeff",
                "\uff54\uff52\uff41\uff49\uff4e"]))  # the last: "train" in fullwidth letters
JOB_FLAGS = ["--nodes", "--procs-per-node", "--strategy", "--gpus", "--checkpoint-uri", "--name", "--max-runtime",
             "--env", "--max-restarts", "--output-uri", "--image", "--emulate", "--module", "--set", "--allow-secret",
             "-f", "--provider"]
SET_FIELDS = ["nodes", "procs_per_node", "max_runtime", "max_wait", "spot", "args", "env", "tags", "inputs",
              "requirements", "script", "image.torch_version", "image.uri", "checkpoint.uri", "checkpoint.keep",
              "checkpoint.interval", "package.max_mb", "providers.aws.region", "providers.aws.bucket",
              "providers.aws.instance_type", "providers.gcp.project", "providers.gcp.machine_type",
              "providers.azure.compute", "providers.azure.instance_type", "providers.local.grace_period",
              "providers.local.store_uri"]


def _project(tmp_path_factory) -> Path:
    proj = tmp_path_factory.mktemp("proj")
    (proj / "train.py").write_text("print(1)\n")
    return proj


def _clean(code: int, err: str) -> None:
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 2:
        assert err.strip(), "a refusal always says why"


@SETTINGS
@given(flag=st.sampled_from(JOB_FLAGS), value=hostile, provider=st.sampled_from(["local", "aws", "gcp", "azure"]))
def test_any_flag_value_never_tracebacks(tmp_path_factory, flag: str, value: str, provider: str) -> None:
    proj = _project(tmp_path_factory)
    region = ["--set", "providers.aws.region=us-east-1"] if provider == "aws" and flag != "--set" else []
    _clean(*run_cli(["plan", str(proj / "train.py"), "-p", provider, *region, flag, value, "-o", "json"]))


@SETTINGS
@given(field=st.sampled_from(SET_FIELDS), value=hostile, provider=st.sampled_from(["local", "aws", "gcp", "azure"]))
def test_any_set_value_never_tracebacks(tmp_path_factory, field: str, value: str, provider: str) -> None:
    proj = _project(tmp_path_factory)
    region = ["--set", "providers.aws.region=us-east-1"] if provider == "aws" and field != "providers.aws.region" \
        else []
    _clean(*run_cli(["plan", str(proj / "train.py"), "-p", provider, *region, "--set", f"{field}={value}",
                     "-o", "json"]))


spec_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**25, 10**25) | st.floats(allow_nan=True) | hostile,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from([*SET_FIELDS, "A", "x\0"]) | hostile,
                                                               inner, max_size=3),
    max_leaves=8)


@SETTINGS
@given(doc=st.dictionaries(st.sampled_from([f for f in JobSpec.model_fields if f != "source_dir"]), spec_values,
                           max_size=6),
       provider=st.sampled_from(["local", "aws", "gcp", "azure"]))
def test_any_spec_file_plans_or_fails_cleanly(tmp_path_factory, doc: dict, provider: str) -> None:
    """Every spec field with values of every type (NUL bytes, huge numbers, nesting), planned for every provider."""
    proj = _project(tmp_path_factory)
    doc.setdefault("script", "train.py")
    (proj / "cloudtrain.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    _clean(*run_cli(["plan", "-f", str(proj / "cloudtrain.yaml"), "-p", provider,
                     "--set", "providers.aws.region=us-east-1", "-o", "json"]))


@SETTINGS
@given(argv=st.lists(flag_values, max_size=6))
def test_any_argv_never_tracebacks(argv: list[str]) -> None:
    code, err = run_cli(["status", *argv] if argv[:1] != ["--help"] else argv)
    assert "Traceback" not in err
    assert code in (0, 2)
