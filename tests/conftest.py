from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cloudtrain.testing.fixtures import ct_home, ddp_project, stop_every_job  # noqa: F401 - shipped for plugins' tests too
from tests import leaks

REPO = Path(__file__).resolve().parents[1]

# A developer's own ~/.config/cloudtrain profile must not leak into what the tests plan (subprocesses inherit this).
# Each pytest process (xdist's workers too) makes one such folder and removes it when it ends (sessionfinish below;
# atexit where no session ran).
PROFILE_DIR = Path(tempfile.mkdtemp(prefix=f"ct-config-{leaks.SESSION}-"))
atexit.register(shutil.rmtree, PROFILE_DIR, True)
os.environ["CLOUDTRAIN_CONFIG"] = str(PROFILE_DIR / "config.yaml")
os.environ.pop("CLOUDTRAIN_PROFILE", None)
# Plugins installed on this machine stay out of cloudtrain's own tests (tests/plugins.py lets a test's own back in).
os.environ["CLOUDTRAIN_PLUGINS"] = "none"
# Tests press Ctrl-C (SIGINT) on the CLI as a terminal does. A suite started in the background by a shell without job
# control (`pytest ... &` in a script) inherits SIGINT ignored, and every process it starts would keep ignoring it:
# those tests would hang, not the code they test. (SIG_IGN survives exec; a handler does not.)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def cli_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["CLOUDTRAIN_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def ended_local_job(project: Path, home: Path, store: Path) -> str:
    """A local job (real torchrun processes) that ran to its end, its checkpoints kept in ``store`` (file://)."""
    (project / "quick.py").write_text("print('done')\n")
    done = subprocess.run([sys.executable, "-m", "cloudtrain", "submit", "quick.py", "-p", "local", "--nodes", "1",
                           "--procs-per-node", "1", "--checkpoint-uri", store.as_uri()],
                          cwd=project, env=cli_env(home), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return next(word for word in done.stderr.split() if word.startswith("local://"))


@pytest.fixture
def cli(ct_home: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:  # noqa: F811
    """Run ``cloudtrain`` as a separate process, the way a user does."""

    def run(*args: str, cwd: Path | None = None, timeout: float = 240,
            env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {**cli_env(ct_home), **(env_extra or {})}
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd or tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return ddp_project(tmp_path)


def wait_for(predicate: Callable[[], bool], timeout: float = 60, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def status_json(cli: Callable[..., subprocess.CompletedProcess[str]], handle: str) -> dict:
    out = cli("status", handle, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _short_id(nodeid: str) -> str:
    """``tests/test_x.py::test_y[a/b]`` -> ``test_x.py::test_y[a/b]`` (a parameter id may hold "/" too)."""
    path, sep, rest = nodeid.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest


# `--quick` (`nox -s quick`): the edit-test loop keeps the tests that run in this process. It leaves out every test
# that uses a fixture starting processes (CLI runs, emulators, cloud fakes, a cluster) and the files whose tests start
# processes themselves; `nox -s tests` runs them all.
STARTS_PROCESSES = {"cli", "ct", "store_root", "faulty", "emulators", "aws", "azure", "vertex", "slurm",
                    "slurm_cluster", "sshd", "ddp_run", "baselines", "tmpfs", "toy_plugin"}
RUNS_PROCESSES = {"test_benchmarks.py", "test_bootstrap.py", "test_bundle_errors.py", "test_byo_checkpoints.py",
                  "test_checkpoint_dir.py", "test_concurrency.py", "test_examples.py", "test_images.py",
                  "test_import_cost.py", "test_launcher_equivalence.py", "test_layers.py", "test_local_lifecycle.py",
                  "test_local_provider.py", "test_log_masking.py", "test_node_helpers.py",
                  "test_node_leaves_nothing.py",
                  "test_node_reports.py", "test_node_restore.py", "test_node_secrets.py", "test_package_guard.py",
                  "test_platforms.py", "test_resume.py", "test_saved_plan.py", "test_secrets.py", "test_slurm.py",
                  "test_soak.py", "test_spec_rule.py", "test_temp_files.py", "test_tour.py", "test_azure_schema.py",
                  "test_plan_text.py", "test_cli_errors.py", "test_fuzz.py", "test_plugins.py",
                  "test_testing_plugin.py", "test_kubernetes.py", "test_kubernetes_secrets.py", "test_spot_notice.py",
                  "test_provider_contract.py", "test_budget.py", "test_compare.py", "test_run_sdk.py",
                  "test_set_aside.py"}

# ... and tests that start a process of their own, or load a cloud SDK's whole model, in files that are otherwise quick
STARTS_ONE = ("test_aws.py::test_prebuilt_image_is_the_one_the_sagemaker_sdk_picks",
              "test_azure.py::test_no_workspace_and_no_credentials_are_clear", "test_export.py::test_azure_export_",
              "test_packaging.py::test_exit_guard_", "test_fidelity_table.py::", "test_kubernetes.py::test_node_fetch_",
              "test_suite_guards.py::test_a_", "test_suite_guards.py::test_the_plan_time_",
              "test_safe_json.py::test_watch_", "test_safe_json.py::test_status_")  # these: a local job, once


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="only the tests that start no process (the edit-test loop: nox -s quick)")


LEAKS_BEFORE: pytest.StashKey[tuple[set[str], set[str]]] = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the xdist controller, or a run without xdist: before any test runs
        config.stash[LEAKS_BEFORE] = leaks.snapshot()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """This process's profile folder goes; then (the controller only, after every worker ended) the run fails where
    it left new files in the working tree or the temp folder (tests/leaks.py)."""
    shutil.rmtree(PROFILE_DIR, ignore_errors=True)
    before = session.config.stash.get(LEAKS_BEFORE, None)
    if before is None or session.exitstatus == pytest.ExitCode.USAGE_ERROR:  # no test ran; workers may still be ending
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = factory.getbasetemp() if factory is not None and factory._basetemp is not None else None
    left = leaks.left_behind(before, basetemp)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"the test run left {len(left)} new file(s) behind (a test's data belongs under its tmp_path):\n  "
                   + "\n  ".join(left))
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            sys.stderr.write(message + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def starts_processes(item: pytest.Item) -> bool:
    return (item.path.name in RUNS_PROCESSES or _short_id(item.nodeid).startswith(STARTS_ONE)
            or bool(STARTS_PROCESSES & set(getattr(item, "fixturenames", ()))))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """``--quick`` leaves out what starts processes; then, on an xdist worker, the groups are checked (check_groups)."""
    if config.getoption("quick"):
        left_out = [item for item in items if starts_processes(item)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not starts_processes(item)]
    yield
    check_groups(config, items)


# pytest-xdist (`nox -s tests`: -n 4 --dist loadgroup). Tests run on any worker, several at once, except those marked
# `pytest.mark.xdist_group(name)` (where the tests are, each with its reason): a group runs on one worker, one test
# after another. A module-scoped fixture is shared only by the tests of one worker, so tests that share an expensive
# one share a group; a test with no group may overlap any other.
UNGROUPED = "pytest-xdist did not group"


def ungrouped_ids(items: list[pytest.Item]) -> list[str]:
    """The ids of the tests marked xdist_group whose node id does not end in ``@<their groups>``, as the worker of
    pytest-xdist 3.8 writes them (into ``item._nodeid``, which pytest 9.2 no longer reads)."""
    lost: list[str] = []
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and not item.nodeid.endswith("@" + "_".join(groups)):
            lost.append(item.nodeid)
    return lost


def check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On each worker of a ``--dist loadgroup`` run, after every plugin's turn at the collection (xdist's writes the
    groups into the ids, from which the controller groups), every grouped test's id must carry its group: else tests
    that must not overlap (one Slurm cluster, a shared baseline run) run on several workers at once and fail at random.
    Where one does not, the worker runs nothing and reports why as a failed collection, which the controller turns
    into a usage error (pytest_collectreport): an error raised here would end the worker and lose the message."""
    if not config.getoption("loadgroup", False):  # set on xdist's workers only, under --dist loadgroup
        return
    lost = ungrouped_ids(items)
    if lost:
        message = (f"{UNGROUPED} {len(lost)} test(s), e.g. {lost[0]}: this pytest ({pytest.__version__}) and "
                   "pytest-xdist do not work together; install the versions pinned in constraints/test.txt")
        config.hook.pytest_collectreport(report=pytest.CollectReport(lost[0], "failed", message, []))
        items[:] = []


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None and str(report.longrepr).startswith(UNGROUPED):  # the controller
        raise pytest.UsageError(str(report.longrepr))


from tests.clouds import aws, azure, kube, vertex  # noqa: E402,F401 - fixtures: each cloud's fake
from tests.emulators import emulators, ensure, root_uri  # noqa: E402,F401 - fixtures
from tests.faulty import faulty  # noqa: E402,F401 - fixture
from tests.preempted_job import preempted_job  # noqa: E402,F401 - fixture (the timeline and report tests' one job)

BACKENDS = ["file", "s3", "gs", "az"]


@pytest.fixture(params=BACKENDS)
def store_root(request: pytest.FixtureRequest, emulators, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
               monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix on each storage backend: file://, S3 (moto), GCS (gcp-storage-emulator), Azure (Azurite); the
    emulator's client settings hold for this test only."""
    tmp = tmp_path_factory.getbasetemp()
    ensure(request.param, emulators, tmp, monkeypatch)
    return root_uri(request.param, tmp)
