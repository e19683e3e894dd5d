"""Secrets never reach a log or a command line: masking at the source (the node's own output and every child's, via
cloudtrain/node/log_masking.py, loaded by the bootstrap from the bundle), torchrun's per-worker log files, and secret
script arguments that travel in the environment and come back in each worker's sys.argv.

Credential-shaped values are assembled at run time, so this file itself holds none."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from cloudtrain.bundle.packaging import build_package
from cloudtrain.node.log_masking import Masker
from cloudtrain.node.secret_values import MASK, env_secrets
from tests.conftest import SCRIPTS
from tests.support import aws_key_id, rand


def test_masker_masks_registered_values_and_known_formats() -> None:
    hf = "h" + "f_" + rand(34)
    pem = "-----BEGIN KEY-----\n" + rand(64) + "\n" + rand(64, seed=3) + "\n-----END KEY-----"
    env = {"DB_PASSWORD": "hunter2-x", "MYPASSWORD": "pw-9876", "GITHUB_PAT": "patvalue123", "PRIVATE_KEY": pem,
           "DATABASE_URL": "postgres://app:s3cr3t-pw@db:5432/x", "PWD": "/home/me", "USE_AUTH": "true",
           "API_KEY": "abc", "PLAIN": "visible-value"}
    masker = Masker(env_secrets(env))
    text = (f"db hunter2-x pw-9876 patvalue123 connect postgres://app:s3cr3t-pw@db:5432/x in /home/me\n"
            f"key line {rand(64, seed=3)} token {hf} id {aws_key_id()} abc true visible-value\n").encode()
    masked = masker(text).decode()
    assert masked == (f"db {MASK} {MASK} {MASK} connect postgres://app:{MASK}@db:5432/x in /home/me\n"
                      f"key line {MASK} token {MASK} id {MASK} abc true visible-value\n")


def test_ordinary_words_under_session_or_path_names_are_not_masked_everywhere() -> None:
    # `nox -s demo` ran the README demo with NOX_CURRENT_SESSION=demo: every path and job id showed `****`
    env = {"NOX_CURRENT_SESSION": "demo", "XDG_SESSION_TYPE": "wayland", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
           "DB_PASSWORD": "hunter2-real"}
    masked = Masker.from_env(env)(b"job demo-1 on wayland via /tmp/ssh-x/agent.1 with hunter2-real\n")
    assert masked == b"job demo-1 on wayland via /tmp/ssh-x/agent.1 with ****\n"


def test_masker_never_splits_a_value_between_blocks_and_lets_partial_lines_through() -> None:
    masker = Masker(["hunter2-x"])
    chunks = [b"password hun", b"ter2-x here\nprogress 10%\r", b"progress 20%", b"", b"\n", b"tail hunter2-x"]
    assert b"".join(masker.blocks(chunks)) == b"password **** here\nprogress 10%\rprogress 20%\ntail ****"
    # the quiet-spell flush (an empty chunk) releases "progress 20%" before its newline arrives
    assert list(masker.blocks([b"prompt> ", b""])) == [b"prompt> "]


def test_masked_output_covers_the_process_and_every_child(tmp_path: Path) -> None:
    """What the bootstrap does: fds 1 and 2 become masked pipes, so pip, torchrun and the workers it echoes are
    masked too, stdout and stderr kept apart, and a prompt without a newline still arrives."""
    secret = "hunter2-" + rand(12)
    program = textwrap.dedent(f"""
        import subprocess, sys, time
        from cloudtrain.node.log_masking import Masker, MaskedOutput
        with MaskedOutput(Masker.from_env({{"DB_PASSWORD": {secret!r}}})):
            print("parent", {secret!r}, flush=True)
            subprocess.run([sys.executable, "-c", "import sys, time;"
                            "print('child out', {secret!r}, flush=True);"
                            "print('child err', {secret!r}, file=sys.stderr, flush=True);"
                            "sys.stdout.write('prompt> '); sys.stdout.flush(); time.sleep(0.6);"
                            "print('answered')"])
        print("after", {secret!r})
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"parent {MASK}", f"child out {MASK}", "prompt> answered", f"after {secret}"]
    assert out.stderr.splitlines() == [f"child err {MASK}"]


def test_log_masking_needs_only_the_standard_library(tmp_path: Path) -> None:
    """The bootstrap loads it from the bundle before anything is installed on the node."""
    root = tmp_path / "src"
    root.mkdir()
    (root / "train.py").write_text("print(1)\n")
    with build_package(root) as package, tarfile.open(package.path) as tar:
        tar.extractall(tmp_path / "bundle", filter="data")
    check = ("import sys; sys.path.insert(0, sys.argv[1]); import cloudtrain.node.log_masking; "
             "extra = sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
             "and m.split('.')[0] not in ('cloudtrain', '__main__')); print(extra); sys.exit(bool(extra))")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", check, str(tmp_path / "bundle" / "lib")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_worker_log_files_are_masked_in_place(tmp_path: Path) -> None:
    secret = "hunter2-" + rand(12)
    log = tmp_path / "worker-logs" / "run_x" / "attempt_0" / "0" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(("line\n" * 100_000 + f"password {secret}\n" + "tail without newline " + secret).encode())
    assert Masker([secret]).mask_tree(tmp_path / "worker-logs") == 1
    text = log.read_text()
    assert secret not in text and text.endswith(f"password {MASK}\ntail without newline {MASK}")
    assert text.count("\n") == 100_001


@pytest.mark.slow
def test_secrets_reach_the_workers_but_no_log_command_line_or_record(cli, ct_home: Path, tmp_path: Path) -> None:
    """Issue 15.9: secrets by name, by shape and as script arguments reach every worker unchanged (sys.argv
    included), while the plans, the job database, the node logs, torchrun's worker logs, the job's output logs,
    `cloudtrain logs` and every command line cloudtrain starts (ps) show them masked or not at all."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(SCRIPTS / "prints_secrets.py", proj)
    values = {"env": "wandb-" + rand(24), "url": f"postgres://app:{'dbpw-' + rand(10)}@db:5432/x",
              "hf": "h" + "f_" + rand(34), "password": "pw-" + rand(14, seed=2)}
    db_password = values["url"].split(":")[2].split("@")[0]
    secrets = [values["env"], db_password, values["hf"], values["password"]]
    flags = ["--procs-per-node", "2", "--env", f"WANDB_API_KEY={values['env']}", "--env",
             f"DATABASE_URL={values['url']}", "--", "--hf-token", values["hf"], f"--password={values['password']}",
             "--epochs", "2"]
    script = str(proj / "prints_secrets.py")
    for command in (["plan"], ["plan", "-o", "json"], ["plan", "-o", "yaml"], ["submit", "--dry-run", "-o", "json"]):
        out = cli(*command, script, *flags)
        assert out.returncode == 0, out.stderr
        assert not any(s in out.stdout + out.stderr for s in secrets), command
    plan = cli("plan", script, *flags).stdout
    assert "postgres://app:****@db:5432/x" in plan and "--hf-token @@CLOUDTRAIN_SECRET_ARG_0@@" in plan
    assert "secret argument(s) of the script travel in the node environment" in plan

    run = cli("submit", script, *flags)
    assert run.returncode == 0, run.stdout + run.stderr
    for name, value in values.items():  # every worker got the real values, arguments included
        assert run.stdout.count(f"digest {name} {hashlib.sha256(value.encode()).hexdigest()}") == 2, name
    assert run.stdout.count("command lines clean: True (3 checked)") == 2  # worker, torchrun, bootstrap
    assert run.stdout.count("]:epochs 2") == 2 and run.stdout.count(f"arg token {MASK}") == 2
    assert not any(s in run.stdout + run.stderr for s in secrets)

    handle = re.search(r"submitted (local://\S+)", run.stdout + run.stderr)
    assert handle, run.stdout
    logs = cli("logs", handle.group(1))
    assert f"env token {MASK} database postgres://app:{MASK}@db:5432/x" in logs.stdout
    assert not any(s in logs.stdout for s in secrets)
    uploaded = sorted(ct_home.glob("store/outputs/*/logs/node-0/attempt_0/local-rank-*/std*.log"))
    assert len(uploaded) == 4 and f"password {MASK}" in "".join(p.read_text() for p in uploaded)
    for path in ct_home.rglob("*"):  # job database, node and worker logs, outputs, status files, staged bundle
        if path.is_file():
            data = path.read_bytes()
            assert not any(s.encode() in data for s in secrets), path


# -- issue 28.1: lines of any length ----------------------------------------------------------------------------


def _boundary_lines(secret: str, block: int) -> list[bytes]:
    """A line longer than a read, with ``secret`` starting at every offset around the read boundary, spaced by
    blanks (a config dump) and not (a compact JSON line)."""
    lines = []
    for offset in range(block - len(secret) - 2, block + 2):
        for before, after in ((b" ", b" "), (b'":"', b'","')):
            head = b"x" * (offset - len(before))
            lines.append(head + before + secret.encode() + after + b"y" * 300 + b"\n")
    return lines


def test_a_secret_cut_at_a_read_boundary_is_masked_whole() -> None:
    """Before: a line longer than 64 KiB was cut at each read and each piece masked alone, so a value across a cut
    was written in clear. Registered values and every well-known format, at each offset around the boundary."""
    from cloudtrain.node.log_masking import _BLOCK

    hf = "h" + "f_" + rand(34)
    env = {"DB_PASSWORD": "hunter2-" + rand(20), "DATABASE_URL": "postgres://app:" + "pw-" + rand(12) + "@db/x"}
    masker = Masker(env_secrets(env))
    for secret in (env["DB_PASSWORD"], hf, env["DATABASE_URL"], aws_key_id()):
        shown = secret.split(":")[-1].split("@")[0] if "://" in secret else secret
        for line in _boundary_lines(secret, _BLOCK):
            out = b"".join(masker.blocks([line[i:i + _BLOCK] for i in range(0, len(line), _BLOCK)]))
            assert shown.encode() not in out and out.count(MASK.encode()) == 1, (secret[:6], len(line))
            assert len(out) == len(line) - len(shown) + len(MASK)  # nothing else lost or doubled


def test_log_files_are_masked_across_every_read(tmp_path: Path) -> None:
    """mask_tree reads torchrun's worker logs 1 MiB at a time: a value across those reads is masked too."""
    secret = "hunter2-" + rand(20)
    log = tmp_path / "worker-logs" / "run" / "attempt_0" / "0" / "stdout.log"
    log.parent.mkdir(parents=True)
    mib = 1 << 20
    data = bytearray(b"z" * (3 * mib + 100) + b"\n" + b"w" * (mib - 3) + secret.encode())
    for k in (1, 2, 3):  # each across a 1 MiB read
        data[k * mib - 5:k * mib - 5 + len(secret)] = secret.encode()
    log.write_bytes(bytes(data))
    assert Masker([secret]).mask_tree(tmp_path / "worker-logs") == 1
    text = log.read_bytes()
    assert secret.encode() not in text and text.count(MASK.encode()) == 4


def test_a_quiet_partial_line_shows_whole_unless_it_may_start_a_secret() -> None:
    """A prompt or a progress bar still shows after a quiet spell; only an end that may be the start of a secret
    (a registered value's first bytes, a token being written) waits for what follows."""
    masker = Masker(["hunter2-secret"])
    assert list(masker.blocks([b"epoch 1/10 [=====>    ] 50% 1.00it/s]", b""])) == [
        b"epoch 1/10 [=====>    ] 50% 1.00it/s]"]
    assert b"".join(masker.blocks([b"password is hunt", b"", b"er2-secret\n"])) == b"password is ****\n"
    hf = "h" + "f_" + rand(34)
    assert b"".join(masker.blocks([f"token {hf[:12]}".encode(), b"", hf[12:].encode() + b"\n"])) == b"token ****\n"


def test_long_lines_through_the_masked_output_and_the_worker_echo(tmp_path: Path) -> None:
    """The node as it runs: fds 1 and 2 are pipes read 64 KiB at a time, and the worker echo lets a line longer
    than 1 MiB through in pieces, each ended as a line of its own. A secret across either cut is masked."""
    secret = "hunter2-" + rand(16)
    logs = tmp_path / "worker-logs"
    worker = logs / "run_1" / "attempt_0" / "0"
    program = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from cloudtrain.node.log_masking import Masker, MaskedOutput
        from cloudtrain.node.worker_echo import MAX_LINE, WorkerEcho
        secret = {secret!r}.encode()
        with MaskedOutput(Masker.from_env({{"DB_PASSWORD": {secret!r}}})):
            for k in range(1, 4):  # straight to fd 1: a JSON line over 64 KiB, the secret across each read
                os.write(1, b'{{"dump":"' + b"a" * ((1 << 16) * k - 22) + b'","pw":"' + secret + b'"}}\\n')
            echo = WorkerEcho(Path({str(logs)!r}))
            folder = Path({str(worker)!r})
            folder.mkdir(parents=True)
            with open(folder / "stdout.log", "ab") as log:  # past MAX_LINE in the middle of the secret
                log.write(b"b" * (MAX_LINE - 3) + secret[:5])
                log.flush()
                echo._poll(final=False)  # a line past MAX_LINE without its end: let through in pieces
                log.write(secret[5:] + b"c" * 10 + b"\\n")
            echo.finish()
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=120,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr.decode()
    shown = out.stdout + out.stderr
    assert not any(secret[i:i + 6].encode() in shown for i in range(len(secret) - 5))  # not even a piece of it
    assert out.stdout.count(MASK.encode()) == 4, out.stdout.count(MASK.encode())
    assert out.stdout.count(b"[default0]:") >= 2  # the worker's line did come in pieces


def test_a_log_masked_in_place_reads_as_its_masked_copy(tmp_path: Path) -> None:
    """Issue 38.18: on a disk with no room for a masked copy, a worker's log is masked in place, each masked block
    written over what was already read; a mask longer than what it hides ('ab' -> '****') may not overtake the reading.
    The result is byte for byte what the masked copy would be."""
    masker = Masker(["ab", "hunter2-" + rand(12)])
    mib = 1 << 20
    data = (b"ab" * (mib // 2) + b"\n" + b"x" * (mib - 7) + b"ab\n") * 3 + b"tail ab"
    log = tmp_path / "stdout.log"
    log.write_bytes(data)
    masker._mask_in_place(log)
    assert log.read_bytes() == b"".join(masker.blocks(data[i:i + mib] for i in range(0, len(data), mib)))
    assert b"ab" not in log.read_bytes() and log.stat().st_size > len(data)
