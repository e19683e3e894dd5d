"""Hostile input, generated: the spec loader and the CLI never show a traceback; bad input always exits 2."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.cli.main import main
from cloudtrain.errors import SpecError
from cloudtrain.spec import JobSpec, load_spec

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


@SETTINGS
@given(flag=st.sampled_from(["--nodes", "--procs-per-node", "--strategy", "--gpus", "--checkpoint-uri", "--name",
                             "--max-runtime", "--env", "--max-restarts", "--output-uri", "--image", "--emulate"]),
       value=flag_values)
def test_any_flag_value_never_tracebacks(tmp_path_factory, flag: str, value: str) -> None:
    proj = tmp_path_factory.mktemp("proj")
    (proj / "train.py").write_text("print(1)\n")
    code, err = run_cli(["plan", str(proj / "train.py"), flag, value, "-o", "json"])
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 2:
        assert err.strip(), "a refusal always says why"


@SETTINGS
@given(argv=st.lists(flag_values, max_size=6))
def test_any_argv_never_tracebacks(argv: list[str]) -> None:
    code, err = run_cli(["status", *argv] if argv[:1] != ["--help"] else argv)
    assert "Traceback" not in err
    assert code in (0, 2)
