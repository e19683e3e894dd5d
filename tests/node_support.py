"""What tests that run a node's bootstrap on this machine share: its first stage loaded from its file, a bundle laid
out as packaging lays it out and the environment a one-node job's node sees. Python 3.8 reads it
(tests/test_bootstrap.py runs there too, in `nox -s bootstrap`): the standard library and the tests' own helpers
only."""

from __future__ import annotations

import importlib.util
import os
import tarfile
from pathlib import Path
from typing import Any

from tests.emulators import free_port

REPO = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "standins"  # a torchrun for interpreters no torch wheel exists for


def load_bootstrap() -> Any:
    """entrypoints/bootstrap.py, the node's first stage, loaded from its file (it is no module of a package)."""
    spec = importlib.util.spec_from_file_location("cloudtrain_bootstrap", REPO / "entrypoints" / "bootstrap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_bundle(folder: Path, script: str) -> Path:
    """A bundle laid out as cloudtrain's packaging lays it out (lib/cloudtrain, lib/sitecustomize.py, src/),
    from this checkout's own files: what a node of any provider unpacks."""
    bundle = folder / "bundle.tar.gz"
    source = folder / "train.py"
    source.write_text(script)
    package = REPO / "cloudtrain"
    with tarfile.open(bundle, "w:gz") as tar:
        for path in sorted(package.rglob("*.py")):
            tar.add(path, arcname="lib/cloudtrain/" + path.relative_to(package).as_posix())
        tar.add(package / "data" / "sitecustomize.py", arcname="lib/sitecustomize.py")
        tar.add(source, arcname="src/train.py")
    return bundle


def node_env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDTRAIN_", "SM_", "AZUREML_", "CLUSTER_SPEC"))}
    env.update(CLOUDTRAIN_NNODES="1", CLOUDTRAIN_NODE_RANK="0", CLOUDTRAIN_MASTER_PORT=str(free_port()),
               CUDA_VISIBLE_DEVICES="", **extra)
    if importlib.util.find_spec("torch") is None:  # see tests/standins/torch/__init__.py
        env["PYTHONPATH"] = str(STANDINS)
    return env
