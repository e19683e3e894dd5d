"""Issue 51, "State files of another shape": every JSON file cloudtrain reads back (leases, lineage, recovery state,
job records, node status files, cost records, checkpoint manifests and markers) goes through cloudtrain.safe_json,
so whatever is found there (any bytes, a document nested 100,000 deep, one of tens of megabytes, a FIFO in the
file's place) gives the caller's named refusal or "none there": never a traceback, never a hang."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sqlite3
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain import contract, safe_json, storage
from cloudtrain.checkpoint import lineage, set_aside
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.manifest import MANIFEST, set_aside_name
from tests.conftest import cli_env, ended_local_job

DEEP = "[" * 100_000 + "]" * 100_000
HANG_SECONDS = 30  # far past what any run here takes: one still running then is waiting on something for ever


# -- the reader itself ----------------------------------------------------------------------------------------------

# strings that look like structure: brackets, quotes and backslashes, escaped and not
tricky = st.text(alphabet=st.sampled_from(list('[]{}"\\/ aé\n\u2028')), max_size=8)
documents = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky,
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky, inner, max_size=3),
                         max_leaves=30)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    return 1 + max(map(_depth, value), default=0) if isinstance(value, list) else 0


@settings(max_examples=150, deadline=None)
@given(doc=documents, limit=st.integers(0, 8), ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 1]))
def test_the_depth_limit_is_exact_whatever_the_strings_hold(doc: Any, limit: int, ascii_only: bool,
                                                            indent: int | None) -> None:
    """A document is refused for its depth exactly when it nests deeper than the limit: brackets, quotes and
    backslashes inside strings never count (the scan that says so runs in C, on bytes, without json)."""
    text = json.dumps(doc, ensure_ascii=ascii_only, indent=indent)
    try:
        read = safe_json.loads(text.encode(), "the document", max_depth=limit)
    except safe_json.UnreadableJson as exc:
        assert _depth(doc) > limit and "the document nests deeper than" in exc.message, (text, exc.message)
    else:
        assert _depth(doc) <= limit and read == doc, text


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300) | st.builds(lambda n, tail: b"[" * n + tail, st.integers(0, 5000),
                                                  st.binary(max_size=20)))
def test_any_bytes_give_a_value_or_one_named_refusal(data: bytes) -> None:
    try:
        safe_json.loads(data, "lease.json")
    except safe_json.UnreadableJson as exc:
        assert exc.message.startswith("lease.json ") and exc.remedy and isinstance(exc, ValueError)


@pytest.mark.parametrize("shape", ["[" * 200_000 + "]" * 200_000, '{"a":' * 200_000 + "1" + "}" * 200_000,
                                   "[" * 200_000, '"' + "\\" * 99_999 + '"' + "[" * 100],
                         ids=["arrays", "objects", "unclosed", "after-a-string"])
def test_crafted_nesting_is_refused(shape: str) -> None:
    with pytest.raises(safe_json.UnreadableJson) as refused:
        safe_json.loads(shape, "x.json")
    assert refused.value.message.startswith("x.json ")


def test_a_fifo_a_folder_a_sparse_giant_and_a_missing_file(tmp_path: Path) -> None:
    fifo, folder, giant = tmp_path / "fifo.json", tmp_path / "folder.json", tmp_path / "giant.json"
    os.mkfifo(fifo)
    folder.mkdir()
    with open(giant, "wb") as f:
        f.truncate(1 << 40)  # a terabyte, on no disk: refused unread
    for path, said in ((fifo, "is not a regular file"), (folder, "is not a regular file"),
                       (giant, "is 1,099,511,627,776 bytes")):
        with pytest.raises(safe_json.UnreadableJson) as refused:
            safe_json.load(path)
        assert refused.value.message.startswith(f"{path} {said}"), refused.value.message  # never waited on
    with pytest.raises(FileNotFoundError):
        safe_json.load(tmp_path / "none.json")


# -- what watch, status and a restore read, given anything --------------------------------------------------------

class Planted(NamedTuple):
    kind: str
    payload: bytes = b""


# each of these, in each file below (and then arbitrary bytes and JSON of any shape, generated)
SPECIAL = [Planted("deep", DEEP.encode()), Planted("deep", ('{"a":' * 150_000).encode()),  # the second cut short
           Planted("huge"), Planted("fifo"), Planted("empty"), Planted("bytes", b"\xff\xfe\x00garbage\x9c")]
SPECIAL_IDS = ["deep-arrays", "deep-objects-cut", "huge", "fifo", "empty", "not-utf8"]
arbitrary = st.one_of(st.builds(Planted, st.just("bytes"), st.binary(max_size=200)),
                      st.builds(Planted, st.just("json"), documents.map(lambda d: json.dumps(d).encode())))
QUICK = settings(max_examples=10, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def plant(path: Path, what: Planted) -> None:
    """``what`` in ``path``'s place (whatever was there goes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if what.kind == "fifo":
        os.mkfifo(path)  # nobody ever writes it: whoever opens it to read waits for ever
    elif what.kind == "huge":
        with open(path, "wb") as f:  # sparse: past safe_json.MAX_BYTES, on no disk
            f.truncate(safe_json.MAX_BYTES + 1)
    else:
        path.write_bytes(what.payload)


@contextlib.contextmanager
def planted_in(path: Path, what: Planted) -> Iterator[None]:
    """``what`` in ``path``'s place for the block; then what was there before (or nothing) again."""
    kept = path.read_bytes() if path.is_file() else None
    plant(path, what)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if kept is not None:
            path.write_bytes(kept)


def run_cli(*argv: str) -> tuple[int, str]:
    """``cloudtrain ARGV`` in this process (fast: nothing imported twice), in a thread that must end within
    HANG_SECONDS; anything but a return code from main is the traceback a user would have seen."""
    from cloudtrain.cli.main import main

    err, ended, code = io.StringIO(), threading.Event(), []

    def run() -> None:
        try:
            code.append(main(list(argv)))
        except SystemExit as exc:
            code.append(exc.code if isinstance(exc.code, int) else 2)
        except BaseException as exc:  # what main let escape: reported below
            err.write(f"Traceback: {exc!r}")
            code.append(-1)
        ended.set()

    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        threading.Thread(target=run, daemon=True).start()
        assert ended.wait(HANG_SECONDS), f"cloudtrain {' '.join(argv)} hangs"
    return code[0], err.getvalue()


def within(action: Callable[[], Any]) -> Any:
    """``action()``, which must end within HANG_SECONDS (a FIFO read as a file would wait for ever)."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(action())
        except BaseException as exc:  # raised again below, in the test's thread
            got.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG_SECONDS)
    assert not worker.is_alive(), f"{action} hangs"
    if isinstance(got[0], BaseException):
        raise got[0]
    return got[0]


def clean(code: int, err: str, path: Path, *, exits: tuple[int, ...] = (0, 2)) -> None:
    """No traceback; exit 0 (the file was taken as missing, said or not) or the refusal's code, naming the file."""
    assert "Traceback" not in err and code in exits, (code, err[-2000:])
    if code != 0:
        assert path.name in err and "fix:" in err, err[-2000:]


def _readers(folder: Path) -> dict[str, tuple[Path, Callable[[], Any], Any]]:
    """Each reader converted that none of the commands below reaches: (the file it reads, read it, what it gives for
    "none there")."""
    from cloudtrain.checkpoint import parts
    from cloudtrain.node import diagnosis, rank_report
    from cloudtrain.providers.local import outcome
    from cloudtrain.providers.slurm.files import SharedFiles
    from cloudtrain.storage.local import local_path

    uri = folder.as_uri()
    return {
        "rank report": (folder / "ranks" / "rank-0.json", lambda: rank_report.summarize(folder / "ranks"), None),
        "torchrun error file": (folder / "error.json", lambda: diagnosis._error_file(folder / "error.json"), None),
        "node status file": (folder / "status.json", lambda: outcome.read_status(folder / "status.json"), None),
        "slurm job record": (folder / "job.json", lambda: SharedFiles(SimpleNamespace(login=None)).read_json(
            str(folder / "job.json")), {}),
        "parts index": (local_path(parts._index_uri(uri, 0)), lambda: parts.read_index(uri, 0), None),
        "parts question": (local_path(parts._ask_uri(uri)), lambda: parts.read_ask(uri), None),
    }


@pytest.mark.parametrize("what", SPECIAL, ids=SPECIAL_IDS)
@pytest.mark.parametrize("reader", list(_readers(Path("/"))))
def test_the_other_readers_take_a_deep_huge_empty_or_garbled_file_or_a_fifo_as_none(
        tmp_path: Path, reader: str, what: Planted) -> None:
    path, read, none = _readers(tmp_path)[reader]
    plant(path, what)
    assert within(read) == none


@pytest.mark.parametrize("what", SPECIAL[:2] + SPECIAL[-2:], ids=SPECIAL_IDS[:2] + SPECIAL_IDS[-2:])
def test_a_safetensors_header_or_an_event_line_of_any_shape(tmp_path: Path, what: Planted) -> None:
    from cloudtrain.checkpoint.files import file_complete
    from cloudtrain.node import events

    model = tmp_path / "model.safetensors"
    model.write_bytes(struct.pack("<Q", len(what.payload)) + what.payload)
    assert within(lambda: file_complete(model)) is False  # a header cloudtrain cannot read: not written whole
    assert events.parse(events.PREFIX + what.payload.decode(errors="replace")) == {}
    with open(model, "r+b") as f:  # a header longer than safe_json reads: cannot say
        f.write(struct.pack("<Q", safe_json.MAX_BYTES + 1))
        f.truncate(safe_json.MAX_BYTES + 100)
    assert file_complete(model) is None


ONE_JOB = pytest.mark.xdist_group("safe_json_chain")  # the cases that share the module's one local job (chain)


class Chain(NamedTuple):
    handle: str
    store: Path
    home: Path


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    """One ended local job whose chain a watch has kept (in the store and in the home): each case plants something
    in one of the files watch and status read, runs them in this process, and puts the file back."""
    from cloudtrain.testing.fixtures import stop_every_job

    root = tmp_path_factory.mktemp("chain")
    home, store, project = root / "home", root / "store", root / "proj"
    project.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(contract.HOME, str(home))
        patch.setenv(contract.CONFIG, str(root / "config.yaml"))
        patch.delenv(contract.PROFILE, raising=False)
        patch.setattr(lineage, "SETTLE_SECONDS", 0.0)  # a lease's write-settle-read, at once in tests
        handle = ended_local_job(project, home, store)
        code, err = run_cli("watch", handle, "--poll", "0.05")
        assert code == 0, err
        try:
            yield Chain(handle, store, home)
        finally:
            stop_every_job(home)


@ONE_JOB
def test_watch_with_a_lease_nested_100000_deep_names_it_never_a_recursion_error(chain: Chain) -> None:
    """The issue's reproduction, as a user runs it: ``cloudtrain watch`` with such a lease.json in the store gave a
    RecursionError traceback. The lease is not cloudtrain's: it holds nothing (said, naming it), and the ended chain
    is seen ended."""
    lease = chain.store / "_cloudtrain" / "lease.json"
    lease.write_text(DEEP)
    watched = subprocess.run([sys.executable, "-m", "cloudtrain", "watch", chain.handle, "--poll", "0.2"],
                             cwd=chain.home.parent, env=cli_env(chain.home), capture_output=True, text=True,
                             timeout=60)
    assert "Traceback" not in watched.stderr and "RecursionError" not in watched.stderr, watched.stderr[-3000:]
    assert watched.returncode == 0, watched.stderr
    assert f"{lease.as_uri()} nests deeper than" in watched.stderr, watched.stderr
    assert f"{chain.handle}: succeeded" in watched.stdout
    assert json.loads(lease.read_text())["expires"] == 0  # taken over, then given back at the chain's end


WATCHED = ["lease.json", "lineage.json", "recovery"]


def _watch(chain: Chain, which: str, what: Planted) -> None:
    """The store's lease and chain file, this home's recovery state: a lease of another shape is taken over
    (said), a chain file this home has a copy of is replaced by it, a recovery file is skipped as none."""
    path = next((chain.home / "recovery").glob("*.json")) if which == "recovery" else \
        chain.store / "_cloudtrain" / which
    with planted_in(path, what):
        code, err = run_cli("watch", chain.handle, "--poll", "0.05")
    clean(code, err, path, exits=(0,))
    if which == "lease.json":
        assert f"{path.as_uri()}" in err and "not trusted" in err, err
    if which == "lineage.json":
        assert f"{path.as_uri()}" in err and "this home's copy of the chain replaces it" in err, err


@ONE_JOB
@pytest.mark.parametrize("what", SPECIAL, ids=SPECIAL_IDS)
@pytest.mark.parametrize("which", WATCHED)
def test_watch_given_a_deep_huge_empty_or_garbled_file_or_a_fifo(chain: Chain, which: str, what: Planted) -> None:
    _watch(chain, which, what)


@ONE_JOB
@QUICK
@given(what=arbitrary, which=st.sampled_from(WATCHED))
def test_watch_given_any_bytes_or_json(chain: Chain, what: Planted, which: str) -> None:
    _watch(chain, which, what)  # the keys generated never make a lease or a chain: each is said not to be one


STATUS_READS = ["recovery", "status_file", "cost"]


def _status(chain: Chain, which: str, what: Planted) -> None:
    """This home's recovery state and cost record, the node's status file: each named, or taken as none."""
    from cloudtrain.plan import cost
    from cloudtrain.providers.local.provider import LocalProvider

    record = LocalProvider(chain.home).db.get(chain.handle.removeprefix("local://"))
    assert record is not None
    path = {"recovery": next((chain.home / "recovery").glob("*.json")),
            "status_file": Path(record.nodes[0]["status_file"]), "cost": cost._path(chain.handle)}[which]
    with planted_in(path, what):
        code, err = run_cli("status", chain.handle)
    clean(code, err, path)


@ONE_JOB
@pytest.mark.parametrize("what", SPECIAL, ids=SPECIAL_IDS)
@pytest.mark.parametrize("which", STATUS_READS)
def test_status_given_a_deep_huge_empty_or_garbled_file_or_a_fifo(chain: Chain, which: str, what: Planted) -> None:
    _status(chain, which, what)


@ONE_JOB
@QUICK
@given(what=arbitrary, which=st.sampled_from(STATUS_READS))
def test_status_given_any_bytes_or_json(chain: Chain, what: Planted, which: str) -> None:
    _status(chain, which, what)


@ONE_JOB
@QUICK
@given(text=st.text(max_size=80) | st.sampled_from([DEEP, "[1]", "{}", "[[]]", '"x"', "null", "[{}]"]),
       column=st.sampled_from(["nodes", "plan"]))
def test_status_and_list_given_any_record_in_the_job_database(chain: Chain, text: str, column: str) -> None:
    """A record's JSON columns as another hand or version left them: one HomeError naming the database, exit 2."""
    db, job_id = chain.home / "jobs.db", chain.handle.removeprefix("local://")
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        kept = conn.execute(f"SELECT {column} FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
        conn.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (text, job_id))
    try:
        shown = [run_cli("status", chain.handle), run_cli("list")]
    finally:
        with contextlib.closing(sqlite3.connect(db)) as conn, conn:
            conn.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (kept, job_id))
    for code, err in shown:
        clean(code, err, db)


class Store(NamedTuple):
    uri: str
    root: Path


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("checkpoints")
    uri = (root / "store").as_uri()
    for step in (1, 2):
        made = root / f"made-{step}"
        made.mkdir()
        (made / "model.txt").write_text(str(step))
        folder = storage.join(uri, checkpoint_store.step_dir(step))
        entries = checkpoint_store.describe_and_upload(made, ["model.txt"], folder, log=lambda _m: None)
        checkpoint_store.publish(folder, step, entries, world_size=1, kind="full", log=lambda _m: None)
    return Store(uri, root / "store")


RESTORE_READS = ["manifest", "set_aside", "restored", "loading", "unpublished"]


def _restore(two_checkpoints: Store, local: Path, which: str, what: Planted) -> None:
    """The newest checkpoint's manifest (the one before it is restored instead), a set-aside marker beside it (the
    same: set aside, its marker said unreadable), the copy this node holds already (restored again), the
    Checkpointer's notes: each read as not there, never raised, never waited on; `cloudtrain checkpoints` lists
    the store whatever it holds."""
    step2 = two_checkpoints.root / checkpoint_store.step_dir(2)
    digest = hashlib.sha256((step2 / MANIFEST).read_bytes()).hexdigest()
    path = {"manifest": step2 / MANIFEST, "set_aside": step2 / set_aside_name(digest),
            "restored": local / checkpoint_store.step_dir(2) / MANIFEST,
            "loading": local / checkpoint_store.LOADING_NOTE,
            "unpublished": local / checkpoint_store.UNPUBLISHED_MARKER}[which]
    with planted_in(path, what):
        report = within(lambda: checkpoint_restore.restore_report(two_checkpoints.uri, local))
        assert report["error"] is None, report
        if which == "manifest":  # refused as corrupt (a FIFO is no object of a store: step 2 is not there)
            refused = within(lambda: checkpoint_store.survey(two_checkpoints.uri, lambda _m: None)).refused
            assert report["step"] == 1 and [r.step for r in refused] == ([] if what.kind == "fifo" else [2]), report
        elif which == "set_aside" and what.kind != "fifo":  # set aside all the same, its marker said unreadable
            aside = within(lambda: set_aside.read(report["passed"][0].checkpoint))
            assert report["step"] == 1 and "is unreadable" in aside.reason, (report, aside)
        else:
            assert report["step"] == 2, report
        code, err = run_cli("checkpoints", two_checkpoints.uri)
        clean(code, err, path, exits=(0,))
        assert within(lambda: checkpoint_store.loading_noted(local)) is None
        unpublished = within(lambda: checkpoint_store.runtime_unpublished(local))
        assert unpublished is None or (which == "unpublished" and "unreadable" in unpublished), unpublished


@pytest.mark.parametrize("what", SPECIAL, ids=SPECIAL_IDS)
@pytest.mark.parametrize("which", RESTORE_READS)
def test_a_restore_given_a_deep_huge_empty_or_garbled_file_or_a_fifo(two_checkpoints: Store, tmp_path: Path,
                                                                       which: str, what: Planted) -> None:
    _restore(two_checkpoints, tmp_path / "restored", which, what)


@QUICK
@given(what=arbitrary, which=st.sampled_from(RESTORE_READS))
def test_a_restore_given_any_bytes_or_json(two_checkpoints: Store, tmp_path_factory: pytest.TempPathFactory,
                                           what: Planted, which: str) -> None:
    _restore(two_checkpoints, tmp_path_factory.mktemp("restored"), which, what)
