"""cloudtrain/node/worker_echo.py: the workers' log files, echoed into the node's output as torchrun's --tee did."""

from __future__ import annotations

import os
from pathlib import Path

from cloudtrain.node.launcher_stderr import LauncherStderr
from cloudtrain.node.worker_echo import MAX_LINE, PARTIAL_LINE_POLLS, WorkerEcho
from tests.conftest import wait_for


def rank_logs(log_dir: Path, run: str, rank: int) -> Path:
    folder = log_dir / run / "attempt_0" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Outs:
    """Two files standing in for the node's stdout and stderr."""

    def __init__(self, root: Path) -> None:
        self.paths = {name: root / f"node-{name}" for name in ("stdout.log", "stderr.log")}
        self.fds = {name: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for name, path in self.paths.items()}

    def read(self, name: str) -> bytes:
        return self.paths[name].read_bytes()

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def test_each_workers_lines_are_prefixed_with_its_local_rank_on_its_own_stream(tmp_path: Path) -> None:
    logs = tmp_path / "worker-logs"
    (rank_logs(logs, "earlier_run", 0) / "stdout.log").write_bytes(b"from an earlier attempt\n")
    outs = Outs(tmp_path)
    echo = WorkerEcho(logs, outs=outs.fds)  # made before torchrun starts: the earlier run is not this one's
    for rank in (0, 1):
        folder = rank_logs(logs, "job_x1", rank)
        (folder / "stdout.log").write_bytes(f"step 1 rank {rank}\nwindows\r\nprogress 50%\rprogress 100%\n".encode()
                                            + b"\xff not utf-8\nno end" * (rank == 1))
        (folder / "stderr.log").write_bytes(f"warning from {rank}\n".encode())
        (folder / "error.json").write_text("{}")  # torchrun's error file: not an output stream
    echo.finish()
    outs.close()
    assert outs.read("stdout.log") == (
        b"[default0]:step 1 rank 0\n[default0]:windows\n[default0]:progress 50%\n[default0]:progress 100%\n"
        b"[default1]:step 1 rank 1\n[default1]:windows\n[default1]:progress 50%\n[default1]:progress 100%\n"
        b"[default1]:\xff not utf-8\n[default1]:no end\n")  # bytes passed on as they are; the last line ended
    assert outs.read("stderr.log") == b"[default0]:warning from 0\n[default1]:warning from 1\n"


def test_a_partial_line_waits_for_its_end_then_shows_after_a_quiet_spell(tmp_path: Path) -> None:
    logs = tmp_path / "worker-logs"
    outs = Outs(tmp_path)
    echo = WorkerEcho(logs, outs=outs.fds)
    out = rank_logs(logs, "run", 0) / "stdout.log"

    def written(data: bytes) -> bytes:
        with open(out, "ab") as f:
            f.write(data)
        echo._poll(final=False)  # one poll of the echo's thread
        return outs.read("stdout.log")

    assert written(b"loss 0.5") == b""  # its end may come with the next write
    assert written(b"1\n") == b"[default0]:loss 0.51\n"
    assert written(b"Password: \r") == b"[default0]:loss 0.51\n"  # a \r held: it may be half of \r\n
    for _ in range(PARTIAL_LINE_POLLS - 1):
        assert written(b"") == b"[default0]:loss 0.51\n"
    assert written(b"") == b"[default0]:loss 0.51\n[default0]:Password: \n"  # quiet long enough: shown
    assert written(b"\nnext\n") == b"[default0]:loss 0.51\n[default0]:Password: \n[default0]:next\n"  # its \n
    echo.finish()
    outs.close()


def test_finish_reads_what_is_left_without_waiting_for_a_poll(tmp_path: Path) -> None:
    logs = tmp_path / "worker-logs"
    outs = Outs(tmp_path)
    echo = WorkerEcho(logs, interval=3600, outs=outs.fds).start()  # the thread would not poll for an hour
    (rank_logs(logs, "run", 0) / "stdout.log").write_bytes(b"last words\n" * 3)
    echo.finish()
    echo.finish()  # idempotent: the node's forced end and its normal end may both call it
    outs.close()
    assert outs.read("stdout.log") == b"[default0]:last words\n" * 3


def test_output_without_line_ends_is_let_through_in_pieces(tmp_path: Path) -> None:
    """A worker writing bytes with no line end (binary output) does not grow the echo's memory without bound."""
    logs = tmp_path / "worker-logs"
    outs = Outs(tmp_path)
    echo = WorkerEcho(logs, outs=outs.fds)
    (rank_logs(logs, "run", 0) / "stdout.log").write_bytes(b"x" * (MAX_LINE + 10))
    echo._poll(final=False)  # one poll: no quiet spell yet, and still no line end
    assert outs.read("stdout.log") == b"[default0]:" + b"x" * (MAX_LINE + 10) + b"\n"
    echo.finish()
    outs.close()


SIGNAL_TRACEBACK = (b"Traceback (most recent call last):\n  File \"run.py\", line 1032, in <module>\n    main()\n"
                    b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15\n")


def _launcher(tmp_path: Path, chunks: list[bytes], stop_after: int | None,
              code: int | None = None) -> tuple[bytes, bytes]:
    """Feed torchrun's stderr through a pipe, as the bootstrap does, the node's stop coming after the first
    ``stop_after`` chunks were read, torchrun ending with ``code``; (what the node shows, what torchrun.log keeps)."""
    tmp_path.mkdir()
    shown, raw = tmp_path / "node-stderr", tmp_path / "torchrun.log"
    out = os.open(shown, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    read_end, write_end = os.pipe()
    launcher = LauncherStderr(raw, out=out)
    launcher.start(os.fdopen(read_end, "rb"))
    for i, chunk in enumerate(chunks):
        if i == stop_after:
            written = sum(map(len, chunks[:i]))  # read by then (torchrun.log gets each line first)
            wait_for(lambda n=written: raw.exists() and raw.stat().st_size == n, timeout=30, interval=0.01)
            launcher.stopping()
        os.write(write_end, chunk)
    os.close(write_end)
    launcher.finish(code)
    os.close(out)
    return shown.read_bytes(), raw.read_bytes()


def test_torchruns_signal_traceback_stays_out_of_the_node_log_when_the_node_stopped_it(tmp_path: Path) -> None:
    """29.2: after a stop the node forwarded, torchrun's SignalException traceback goes to torchrun.log only."""
    warning = b"W1125 api.py:753] Received 15 death signal, shutting down workers\n"
    shown, kept = _launcher(tmp_path / "a", [b"rendezvous ok\n", warning, SIGNAL_TRACEBACK], stop_after=1)
    assert shown == b"rendezvous ok\n" + warning and kept == b"rendezvous ok\n" + warning + SIGNAL_TRACEBACK
    # without a stop of ours (someone else signalled torchrun) it is shown, as is any other traceback after a stop
    assert _launcher(tmp_path / "b", [SIGNAL_TRACEBACK], stop_after=None)[0] == SIGNAL_TRACEBACK
    failed = b"Traceback (most recent call last):\n  File \"x\"\nChildFailedError: \n=====\nroot cause\n"
    assert _launcher(tmp_path / "c", [failed], stop_after=0)[0] == failed
    # the full run's flake: the peer's store went away with it, so c10d's warning and its C++ stack followed the
    # traceback (the traceback's last line was no longer torchrun's last); both are the stop's noise too
    store_gone = (b"[W1126 04:36:04.597821720 TCPStore.cpp:115] [c10d] recvVector failed on SocketImpl(fd=3, "
                  b"addr=[::ffff:127.0.0.1]:33484, remote=[::ffff:127.0.0.1]:49159): Failed to recv, got 0 bytes. \n"
                  b"Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 "
                  b"(most recent call first):\nframe #0: c10::Error::Error() + 0x98 (0x7f in libc10.so)\n"
                  b"frame #1: <unknown function> + 0x5f (0x7f in libtorch_cpu.so)\n\n")
    shown, kept = _launcher(tmp_path / "d", [warning, SIGNAL_TRACEBACK, store_gone], stop_after=1)
    assert shown == warning and kept == warning + SIGNAL_TRACEBACK + store_gone
    after = b"cloudtrain: something else torchrun said\n"  # anything else after it is still shown
    assert _launcher(tmp_path / "e", [SIGNAL_TRACEBACK, store_gone, after], stop_after=0)[0] == after


# -- issue 50: torchrun's teardown noise, however its threads' lines interleave on a busy machine -------------------
DEATH = (b"W1207 20:38:17.441000 29227 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
         b"shutting down workers\n")
CLOSING = (b"W1207 20:38:17.441000 29227 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 29352 "
           b"closing signal SIGTERM\n")
# node 1's agent, busy, after node 0's agent (which hosts the rendezvous store) had already exited: its keep-alive
# thread's c10d warning and C++ stack, then the rendezvous' own line (as a frozen agent printed them here)
STORE_CLOSED = (
    b"[W1207 20:38:17.746518830 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=3, "
    b"addr=[::ffff:127.0.0.1]:52062, remote=[::ffff:127.0.0.1]:50903): Failed to recv, got 0 bytes. Connection was "
    b"likely closed. Did the remote server shutdown or crash?\n"
    b"Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 (most recent "
    b"call first):\n"
    b"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f14c4f79b8d in libc10.so)\n"
    b"frame #7: c10d::TCPStore::get(std::string const&) + 0x8e (0x7f14b6b43a1e in libtorch_cpu.so)\n"
    b"<omitting python frames>\n"
    b"frame #22: <unknown function> + 0x1098ec (0x7f14c73278ec in /lib/x86_64-linux-gnu/libc.so.6)\n"
    b"\n")
KEEP_ALIVE = (b"W1207 20:38:17.450000 29227 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1346] The node "
              b"'localhost_29227_0' has failed to send a keep-alive heartbeat to the rendezvous 'sleeper-1' due to an "
              b"error of type RendezvousConnectionError.\n")
# torchrun aborting as it exits (a C++ thread still running), then faulthandler's dump (its @record enables it)
ABORTED = (b"terminate called without an active exception\nFatal Python error: Aborted\n\n"
           b"Thread 0x00007f14c71ff6c0 (most recent call first):\n"
           b"  File \"/usr/lib/python3.11/threading.py\", line 331 in wait\n\n"
           b"Current thread 0x00007f14c7a4b740 (most recent call first):\n  <no Python frame>\n\n"
           b"Extension modules: numpy.core._multiarray_umath, torch._C, torch._C._fft (total: 3)\n")


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def test_the_stops_traceback_stays_out_however_the_store_noise_interleaves_with_it(tmp_path: Path) -> None:
    """A busy machine interleaves torchrun's threads: the keep-alive thread's c10d warning fell inside the main
    thread's SignalException traceback, whose end was then taken for another exception and the whole traceback
    shown (tests/test_local_lifecycle.py::test_preempt_says_what_it_did failed so in CI). The abort that may follow
    at exit, and the store's noise before the traceback, are the teardown's too."""
    tb = _lines(SIGNAL_TRACEBACK)
    for n, chunks in enumerate([
            [DEATH, CLOSING, *tb[:2], STORE_CLOSED, KEEP_ALIVE, *tb[2:]],  # inside the traceback
            [DEATH, STORE_CLOSED, CLOSING, KEEP_ALIVE, SIGNAL_TRACEBACK, ABORTED],  # before it; an abort after it
            [DEATH, CLOSING, *tb[:3], ABORTED],  # the abort cut the traceback short
    ]):
        shown, kept = _launcher(tmp_path / str(n), chunks, stop_after=0, code=1)
        assert shown == DEATH + CLOSING, shown.decode()
        assert kept == b"".join(chunks)  # torchrun.log keeps it all


def test_a_peers_store_gone_before_this_nodes_own_stop_is_the_teardowns_too(tmp_path: Path) -> None:
    """Node 0 stopped and exited first; node 1, busy, saw the store go before its own bootstrap forwarded it the
    stop: that warning was shown at once."""
    shown, kept = _launcher(tmp_path / "a", [b"rendezvous ok\n", STORE_CLOSED, KEEP_ALIVE, DEATH, SIGNAL_TRACEBACK],
                            stop_after=3, code=1)
    assert shown == b"rendezvous ok\n" + DEATH, shown.decode()
    assert STORE_CLOSED in kept


def test_a_succeeded_torchruns_teardown_noise_is_kept_out_and_a_failures_shown_whole(tmp_path: Path) -> None:
    """torchrun exits 0 after node 0's store went away under its rendezvous shutdown: the c10d stack is noise. The
    same lines from a torchrun that failed on its own (no stop of the node's) are shown, in their order; a store
    warning followed by more of torchrun's output (the run went on) is shown too."""
    shutdown = KEEP_ALIVE.replace(b"send a keep-alive heartbeat to", b"shutdown")
    assert _launcher(tmp_path / "a", [STORE_CLOSED, shutdown], stop_after=None, code=0)[0] == b""
    failed = b"Traceback (most recent call last):\n  File \"x\"\nRendezvousConnectionError: store gone\n"
    chunks = [STORE_CLOSED, KEEP_ALIVE, failed, ABORTED]
    assert _launcher(tmp_path / "b", chunks, stop_after=None, code=-6)[0] == b"".join(chunks)
    went_on = [STORE_CLOSED, b"W1207 api.py:900] something torchrun said while the run went on\n"]
    assert _launcher(tmp_path / "c", went_on, stop_after=None, code=0)[0] == b"".join(went_on)
    # after a stop, a traceback with an exception that is not the stop's is shown, chained to it or not
    chained = (b"Traceback (most recent call last):\n  File \"x\"\nChildFailedError: rank 0 failed\n\n"
               b"During handling of the above exception, another exception occurred:\n\n" + SIGNAL_TRACEBACK)
    assert _launcher(tmp_path / "d", [DEATH, failed], stop_after=0, code=1)[0] == DEATH + failed
    assert _launcher(tmp_path / "e", [DEATH, SIGNAL_TRACEBACK.replace(b"SignalException", b"ValueError")],
                     stop_after=0, code=1)[0].count(b"Traceback") == 1
    assert _launcher(tmp_path / "f", [DEATH, chained], stop_after=0, code=1)[0] == DEATH + chained
