"""Sessions: lint, typecheck, tests (everything but the soak-marked runs, in parallel), soak (the preemption soaks,
the fuzzers and the other long end-to-end runs, then the full preemption soak), compat (the node runtime on the
oldest torch cloudtrain supports), bootstrap (the in-node code under the oldest Python a node image carries): what CI
runs. quick (the fast unit tests, for the edit-test loop), demo, and live (real clouds, opt-in).
Every install goes through constraints/test.txt, which pins the CPU build of torch so pip never swaps in a
multi-GB CUDA wheel (compat swaps in the oldest torch, whose only build on PyPI is a CUDA one)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests", "soak", "compat", "bootstrap"]
nox.options.reuse_existing_virtualenvs = True
CONSTRAINTS = ("-c", "constraints/test.txt")


def install(session: nox.Session, *args: str) -> None:
    session.install(*CONSTRAINTS, *args)


AZURITE = "azurite@3.37.0"
NODE_PYTHON = "3.8"  # the oldest Python of any image cloudtrain picks (Azure's torch 1.13 environment)


def node_side() -> list[str]:
    """What runs on a node under NODE_PYTHON (the bootstrap, node contracts, the modules they start, sitecustomize,
    the runtime in the workers): the files pyproject.toml gives ruff a py38 target, tests excepted."""
    import tomllib

    targets = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["ruff"]["per-file-target-version"]
    found = {path for pattern, version in targets.items() if version == "py38" and not pattern.startswith("tests/")
             for path in glob.glob(pattern, recursive=True)}
    return sorted(found)


def interpreter(version: str) -> str:
    """``pythonX.Y`` from PATH when it runs, else pyenv's build of it (pyenv's shims answer 'command not found'
    for a version that is installed but not selected, which is how CI machines carry their older Pythons)."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
        return found
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    builds = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    return builds[-1] if builds else version  # nox says plainly when neither exists


def azurite(session: nox.Session) -> None:
    """The Azure Blob emulator, from npm, where the tests find it (AZURITE_BIN)."""
    node = Path(".nox/node")
    if not (node / "node_modules/.bin/azurite-blob").exists():
        session.run("npm", "install", "--no-audit", "--no-fund", "--prefix", str(node), AZURITE, external=True)
    session.env["AZURITE_BIN"] = str((node / "node_modules/.bin/azurite-blob").resolve())


def compiled(session: nox.Session) -> None:
    """Byte-compile the repository's modules once. The tests start a few thousand Python processes (CLI, supervisor,
    bootstrap) that import cloudtrain from this checkout (an editable install); where PYTHONDONTWRITEBYTECODE is set,
    as on CI's machines, none writes a .pyc, so each compiled every module it imports again (~0.06 s of a 0.25 s
    CLI call). An installed cloudtrain has its .pyc from pip, so this is also what users run."""
    session.run("python", "-m", "compileall", "-q", "cloudtrain", "entrypoints", "tests", "benchmarks")


# pytest-xdist: tests that wait on subprocesses, emulators and sleeps overlap; the ones that would contend share a
# group (a pytest.mark.xdist_group mark where the tests are) and run one after another on one worker. Four workers on
# two cores: most of a worker's time is spent waiting on a child process.
PARALLEL = ("-n", os.environ.get("CLOUDTRAIN_TEST_WORKERS", "4"), "--dist", "loadgroup")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Every test but the soak-marked ones (``nox -s soak``), in parallel; ``-- ARGS`` replaces the pytest arguments."""
    install(session, "-e", ".[dev]")
    compiled(session)
    azurite(session)
    session.run("pytest", *(session.posargs or ["-q", *PARALLEL, "-m", "not live and not soak"]))


@nox.session(python="3.11")
def soak(session: nox.Session) -> None:
    """The long runs CI makes: the reduced preemption soak, the fuzzers and the other soak-marked tests (pytest -m
    soak). ``-- full`` runs the full preemption soak after them, 20 random SIGTERM/SIGKILL interruptions of a 2x2 FSDP
    job (benchmarks/soak.py, ~8 min here); other ``-- ARGS`` replace the pytest arguments."""
    install(session, "-e", ".[dev]")
    compiled(session)
    azurite(session)
    full = session.posargs == ["full"]
    session.run("pytest", *(session.posargs if session.posargs and not full else ["-q", *PARALLEL, "-m", "soak"]))
    if full:
        session.run("python", "benchmarks/soak.py", "--interruptions", "20", "--seed", "1")


# The oldest torch cloudtrain supports (pyproject's floor; Vertex's newest prebuilt container runs it, SageMaker's
# and Azure's default images 2.5): torch's behaviour and the private helpers the Checkpointer leans on changed since.
COMPAT_TORCH = "2.4.1"
COMPAT_TESTS = ["tests/test_runtime_compat.py", "tests/test_goodput.py", "tests/test_dcp_files.py",
                "tests/test_node_restore.py", "tests/test_on_demand.py",
                "tests/test_resume.py::test_preempted_then_hard_killed_resumes_bitwise[ddp-file]"]


@nox.session(python="3.11")
def compat(session: nox.Session) -> None:
    """The node runtime (the Checkpointer's staging, DCP files, on-demand restore, a bitwise DDP resume) on
    COMPAT_TORCH. PyPI has only its CUDA build (about 3 GB with its libraries), which runs on CPU. Its FSDP needs
    CUDA (torch 2.4 and 2.5), so the FSDP tests stay in ``tests``. ``-- ARGS`` replace the pytest arguments."""
    pins = Path(session.create_tmp()) / "constraints.txt"
    pins.write_text("".join(f"torch=={COMPAT_TORCH}\n" if line.startswith("torch==") else line
                            for line in Path("constraints/test.txt").read_text().splitlines(keepends=True)))
    session.install("-c", str(pins), "-e", ".[dev]")
    compiled(session)
    azurite(session)
    session.run("pytest", *(session.posargs or ["-q", "-n", "2", "--dist", "loadgroup", *COMPAT_TESTS, "-k",
                                                "not fsdp and not sharded_rank"]))


@nox.session(python="3.11")
def quick(session: nox.Session) -> None:
    """The fast unit tests, for the edit-test loop (under two minutes): no slow or soak mark, and none that starts a
    process (``--quick``, tests/conftest.py). ``-- ARGS`` are added (``nox -s quick -- tests/test_spec.py -x``)."""
    install(session, "-e", ".[dev]")
    compiled(session)
    session.run("pytest", "-q", "-n", "2", "--quick", "-m", "not live and not slow and not soak", *session.posargs)


@nox.session(python=interpreter(NODE_PYTHON), venv_backend="venv")  # virtualenv no longer seeds 3.8
def bootstrap(session: nox.Session) -> None:
    """What runs on a node before the user's script (entrypoints/bootstrap.py and the cloudtrain modules it starts),
    tested under Python 3.8: the oldest interpreter of any image cloudtrain can choose."""
    session.install("pytest==8.3.5", "pytest-timeout==2.3.1")  # the last releases that support Python 3.8
    session.run("pytest", "-p", "no:cacheprovider", *(session.posargs or ["-q", "tests/test_bootstrap.py"]))


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    install(session, "ruff", "import-linter", "vermin")
    session.run("ruff", "check", "cloudtrain", "entrypoints", "tests", "benchmarks", "examples", "noxfile.py")
    # what runs on a node (bootstrap, node contracts, the modules they start, the runtime in the workers) uses nothing
    # newer than Python 3.8 at run time, which importing it under 3.8 (nox -s bootstrap) cannot show for every path
    session.run("vermin", "-t=3.8-", "--no-tips", "--violations", "--no-parse-comments", *node_side())
    # the layers and cycles declared in pyproject.toml ([tool.importlinter]); cloudtrain importable, not installed
    session.run("lint-imports", env={"PYTHONPATH": str(Path.cwd())})


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    install(session, "-e", ".[local]", "mypy", "types-PyYAML")  # cloud clients are imported lazily; not needed here
    session.run("mypy")


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """A real local job: 2 nodes x 2 gloo processes training the reference DDP model, checkpointing to a local
    store, preempted once, restarted and resumed from its checkpoint."""
    install(session, "-e", ".[local]")
    session.run("cloudtrain", "plan", "entrypoints/train_ddp.py", "--nodes", "2", "--procs-per-node", "2")
    session.run("python", "examples/preemption_demo.py")


@nox.session(python="3.11")
def live(session: nox.Session) -> None:
    """Tiny real jobs on your own cloud account: `nox -s live -- aws` (see tests/live/ for what each needs)."""
    install(session, "-e", ".[dev]")  # dev holds every provider that has a live test
    clouds = session.posargs or ["aws"]
    session.run("pytest", "-m", "live", "-v", "-s", *[f"tests/live/test_{cloud}_live.py" for cloud in clouds])
