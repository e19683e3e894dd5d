"""The conformance suite ships with cloudtrain (``cloudtrain.testing``, a ``pytest11`` plugin): a provider package's
tests, run where cloudtrain is installed as a wheel installs it and no cloudtrain source checkout exists, inherit
``ProviderConformance`` and get its fixtures from the plugin (no conftest). And the plugin stays out of the way of
every other pytest run and of the CLI: its module top imports nothing heavy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.conftest import REPO
from tests.plugins import PLUGIN
from tests.support import HEAVY, block, imported_modules

PLUGIN_TESTS = block("The conformance suite")  # the guide's example, as a plugin package writes it


def installed_like_a_wheel(site: Path) -> None:
    """cloudtrain as its wheel installs it (pyproject's hatch config): the package with entrypoints/ inside, and a
    .dist-info holding the entry points pyproject declares."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    shutil.copytree(REPO / "cloudtrain", site / "cloudtrain", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "entrypoints", site / "cloudtrain" / "_entrypoints")
    dist = site / f"cloudtrain-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cloudtrain\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) for group, entries in groups.items()))


def plugin_beside_cloudtrain(tmp: Path, name: str, entry_points: str, test_name: str,
                             tests: str) -> tuple[Path, Path, Path]:
    """cloudtrain installed like its wheel in ``tmp/site``, the plugin package ``tests/plugin/<name>`` registered
    there by its .dist-info (``entry_points``), and its own tests in ``tmp/<name>-src/tests``: (site, package
    source, the plugin's .dist-info)."""
    site, package = tmp / "site", tmp / f"{name}-src"
    installed_like_a_wheel(site)
    shutil.copytree(PLUGIN / name, package / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points + "\n")
    (package / "tests").mkdir()
    (package / "tests" / test_name).write_text(tests)
    return site, package, dist


def test_a_plugin_package_runs_the_shipped_suite_without_a_cloudtrain_checkout(tmp_path: Path) -> None:
    site, package, _ = plugin_beside_cloudtrain(tmp_path, "toyprov", "[cloudtrain.providers]\ntoy = toyprov:PROVIDER",
                                                "test_toy.py", PLUGIN_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDTRAIN_")}  # as on the plugin author's machine
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(package)])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                           "tests/test_toy.py", "-W", "error::pytest.PytestUnknownMarkWarning"],
                          cwd=package, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "12 passed" in done.stdout and "1 deselected" in done.stdout, done.stdout[-2000:]
    probe = subprocess.run([sys.executable, "-c", "import cloudtrain, tests.conftest"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No module named 'tests" in probe.stderr  # no checkout on that path


def test_the_pytest_plugin_module_imports_nothing_heavy() -> None:
    names = imported_modules("import cloudtrain.testing.fixtures")
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []
    assert {n for n in names if n.startswith("cloudtrain")} <= {"cloudtrain", "cloudtrain._lazy",
                                                                 "cloudtrain.testing", "cloudtrain.testing.fixtures"}


def test_the_cli_never_imports_the_suite(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    code = "from cloudtrain.cli.main import main\nraise SystemExit(main(['plan', 'train.py', '--provider', 'local']))"
    names = imported_modules(code, cwd=tmp_path, env=env)
    assert "cloudtrain.spec.model" in names and not [n for n in names if n.startswith("cloudtrain.testing")]


STORE_TESTS = '''
import os, socket, subprocess, sys, time
import boto3, pytest
from cloudtrain.testing.stores import StoreConformance


@pytest.fixture(scope="module")
def endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    os.environ.update(R2_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                      AWS_DEFAULT_REGION="us-east-1")
    for _ in range(200):
        try:
            boto3.client("s3", endpoint_url=url).create_bucket(Bucket="models")
            break
        except Exception:
            time.sleep(0.05)
    yield url
    server.kill()


class TestR2(StoreConformance):
    @pytest.fixture
    def store_root(self, endpoint, tmp_path):
        return f"r2://models/{tmp_path.name}"
'''


def test_a_store_plugin_passes_the_shipped_store_suite_without_a_cloudtrain_checkout(tmp_path: Path) -> None:
    """Issue 39.3: storage schemes are open to plugins (entry-point group cloudtrain.stores) and the store suite ships
    in cloudtrain.testing. A third-party r2:// store (tests/plugin/r2store: S3's API at an endpoint of its own, here
    the S3 emulator) passes it where cloudtrain is installed as its wheel installs it; a spec takes r2:// URIs once
    the plugin is installed, and names the fix when it is not."""
    site, package, dist = plugin_beside_cloudtrain(tmp_path, "r2store", "[cloudtrain.stores]\nr2 = r2store:R2Store",
                                                   "test_r2.py", STORE_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDTRAIN_", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(package)])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_r2.py"],
                          cwd=package, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout, done.stdout[-2000:]  # the plugin copies objects (S3Store.copy)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    plan = ["-m", "cloudtrain", "plan", "train.py", "-p", "local", "--checkpoint-uri", "r2://models/run1"]
    home = {"CLOUDTRAIN_HOME": str(tmp_path / "home"), "CLOUDTRAIN_CONFIG": str(tmp_path / "config.toml")}
    planned = subprocess.run([sys.executable, *plan], cwd=tmp_path / "proj", env={**env, **home},
                             capture_output=True, text=True, timeout=120)
    assert planned.returncode == 0 and "r2://models/run1" in planned.stdout, planned.stdout + planned.stderr
    shutil.rmtree(dist)  # the plugin uninstalled
    without = subprocess.run([sys.executable, *plan], cwd=tmp_path / "proj", capture_output=True, text=True,
                             env={**env, **home, "PYTHONPATH": str(site)}, timeout=120)
    assert without.returncode == 2 and "r2://" in without.stderr and "Traceback" not in without.stderr, \
        without.stderr
