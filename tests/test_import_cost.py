"""`cloudtrain --help` must start instantly: no provider SDK, no torch, not even pydantic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import HEAVY, imported_modules


def test_cli_import_pulls_in_nothing_heavy() -> None:
    names = imported_modules("import cloudtrain.cli.main")
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == []


def test_help_pulls_in_nothing_heavy() -> None:
    code = "import sys; from cloudtrain.cli.main import main\ntry: main(['--help'])\nexcept SystemExit: pass"
    names = imported_modules(code)
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []


def test_sdk_import_is_lazy() -> None:
    names = imported_modules("import cloudtrain; cloudtrain.__version__")
    assert not any(n.split(".")[0] in HEAVY for n in names)


def test_the_node_side_loads_nothing_client_side() -> None:
    """What the bootstrap's first stage hands over to (cloudtrain.node.entry) and what that runs from the bundle loads
    only the node side: no spec, plan, provider or CLI module, nothing heavy (a node has only its image's Python and
    torch)."""
    code = ("import cloudtrain.node.entry, cloudtrain.node.steps, cloudtrain.node.watch, cloudtrain.node.log_masking, "
            "cloudtrain.node.worker_echo, cloudtrain.node.process_tree, cloudtrain.node.output_upload, "
            "cloudtrain.node.spot_notice, cloudtrain.node.torchrun, cloudtrain.node.prepare, cloudtrain.node.outcome")
    names = imported_modules(code)
    node_side = ("cloudtrain", "cloudtrain._lazy", "cloudtrain.contract", "cloudtrain.errors", "cloudtrain.backoff",
                 "cloudtrain.safe_json")
    client = sorted(n for n in names if n.startswith("cloudtrain.") and n not in node_side
                    and not n.startswith(("cloudtrain.node", "cloudtrain.checkpoint", "cloudtrain.storage")))
    assert client == []
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []


def test_reading_a_local_job_loads_no_spec_and_no_pydantic(tmp_path: Path) -> None:
    """`cloudtrain status|logs|wait|list` of a local job (a short process each, and each poll of a script's loop):
    the job database and the provider's base, not the spec's models or packaging (0.21 s -> 0.08 s a call)."""
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    code = ("from cloudtrain.cli.main import main\n"
            "codes = [main(['list', '--provider', 'local'])] + [main([c, 'local://gone-20260101-000000-0000'])\n"
            "                                                   for c in ('status', 'logs', 'wait')]\n"
            "assert codes == [0, 2, 2, 2], codes")  # an unknown job: each loads what it needs before it finds none
    names = imported_modules(code, cwd=tmp_path, env=env, at_exit=True)
    assert "cloudtrain.providers.local.provider" in names
    assert sorted(n for n in names if n.split(".")[0] == "pydantic" or n in (
        "cloudtrain.spec.model", "cloudtrain.bundle.packaging", "cloudtrain.platforms.node_commands",
        "cloudtrain.bundle.staging")) == []


def test_a_plan_with_no_yaml_to_read_does_not_load_yaml(tmp_path: Path) -> None:
    """A project without cloudtrain.yaml and a machine without a config file: yaml is never imported (it was, at
    every start, for ~15 ms of a local job's ~0.3 s CLI phase)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "CLOUDTRAIN_CONFIG": str(tmp_path / "none.yaml"),
           "PYTHONPATH": str(REPO)}
    code = "from cloudtrain.cli.main import main\nraise SystemExit(main(['plan', 'train.py', '--provider', 'local']))"
    names = imported_modules(code, cwd=tmp_path, env=env)
    assert "cloudtrain.spec.model" in names  # the plan really ran
    assert not [n for n in names if n.split(".")[0] == "yaml"]


def _plan_modules(tmp_path: Path, provider: str) -> set[str]:
    """The modules `cloudtrain plan train.py --provider PROVIDER` imports, offline, with no settings anywhere but
    the region (for aws, run twice: the second run is the one timed, with cloudtrain's cache of botocore data warm)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "CLOUDTRAIN_CONFIG": str(tmp_path / "none.yaml"),
           "PYTHONPATH": str(REPO), "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")}
    code = ("from cloudtrain.cli.main import main\n"
            f"raise SystemExit(main(['plan', 'train.py', '--provider', {provider!r}, '-o', 'json']))")
    imported_modules(code, cwd=tmp_path, env=env, at_exit=True)
    return imported_modules(code, cwd=tmp_path, env=env, at_exit=True)


@pytest.mark.parametrize("provider", ["local", "aws", "azure", "gcp"])
def test_a_plan_builds_only_its_own_providers_options(tmp_path: Path, provider: str) -> None:
    """Issue 32.9: importing cloudtrain.spec.model built every provider's options model (~0.27 s with pydantic); a plan
    now builds its own provider's only."""
    names = _plan_modules(tmp_path, provider)
    assert f"cloudtrain.providers.{provider}.options" in names
    others = sorted(n for n in names if n.endswith(".options") and n.startswith("cloudtrain.providers.")
                    and n != f"cloudtrain.providers.{provider}.options")
    assert others == []


def test_an_aws_plan_reads_botocore_data_from_the_cache(tmp_path: Path) -> None:
    """Issue 32.9: botocore's whole SageMaker model and endpoint table were parsed by every aws plan; the slices a
    plan needs are cached (cloudtrain.home.paths.derived), so neither botocore.session nor botocore.loaders loads."""
    names = _plan_modules(tmp_path, "aws")
    assert "botocore.validate" in names  # the request is still checked by botocore's own validator
    assert sorted(n for n in names if n in ("botocore.session", "botocore.loaders")) == []
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "home" / "cache").iterdir()) == ["partitions", "sagemaker"]


@pytest.mark.parametrize("shape", ['{"x": 1}', "[1, 2]", '[{"regions": 5}]', "not json"])
def test_a_cache_of_another_shape_is_built_again(cli, ct_home: Path, tmp_path: Path, shape: str) -> None:
    """Issue 38.15's sibling: a file in the home's cache of another shape (another version's, a damaged one) ended an
    aws plan in AttributeError; it is built again from botocore, as a missing one is."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    flags = ["plan", "train.py", "-p", "aws", "--set", "providers.aws.region=us-east-1", "-o", "json"]
    first = cli(*flags, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    cached = sorted((ct_home / "cache").iterdir())
    assert [p.name.split("-")[1] for p in cached] == ["partitions", "sagemaker"]
    kept = {p: p.read_text() for p in cached}
    for path in cached:
        path.write_text(shape)
    again = cli(*flags, cwd=tmp_path)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert {p: p.read_text() for p in cached} == kept, "rebuilt as it was"
