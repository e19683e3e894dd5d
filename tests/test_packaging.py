from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cloudtrain.bundle.packaging import PackageLimits, build_package
from cloudtrain.errors import PackagingError
from tests.node_support import load_bootstrap
from tests.support import make_tree


def test_bundle_is_deterministic_across_mtimes(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    with build_package(root) as first:
        digest = first.digest
        data = first.path.read_bytes()
    for path in root.rglob("*"):
        os.utime(path, (1, 1))
    with build_package(root) as second:
        assert second.digest == digest
        assert second.path.read_bytes() == data


def test_bundle_layout_and_excludes(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    with build_package(root) as package, tarfile.open(package.path) as tar:
        names = tar.getnames()
        assert [f["path"] for f in package.files] == [".env.example", "pkg/model.py", "train.py"]
        assert "bootstrap.py" in names and "src/train.py" in names and "lib/cloudtrain/runtime/distributed.py" in names
        # cloudtrain's node side only: the node package, storage, the runtime, the providers' node contracts
        assert {"lib/cloudtrain/node/steps.py", "lib/cloudtrain/storage/s3.py", "lib/cloudtrain/errors.py",
                "lib/cloudtrain/providers/aws/node.py", "lib/sitecustomize.py"} <= set(names)
        assert not {"lib/cloudtrain/spec/model.py", "lib/cloudtrain/sdk.py", "lib/cloudtrain/providers/aws/provider.py",
                    "lib/cloudtrain/providers/__init__.py", "lib/cloudtrain/cli/main.py"} & set(names)
        assert not any(".git" in n.split("/") or "__pycache__" in n for n in names)
        assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in tar.getmembers())
    assert not package.path.exists()  # closed: the temp bundle is gone


def test_content_change_changes_digest(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    with build_package(root) as a:
        before = a.digest
    (root / "train.py").write_text("print('changed')\n")
    with build_package(root) as b:
        assert b.digest != before


@pytest.mark.parametrize("secret", [".env", "key.pem", "id_rsa", ".aws/credentials", "gcp-service-account.json"])
def test_secrets_are_refused(tmp_path: Path, secret: str) -> None:
    root = make_tree(tmp_path / "src")
    (root / secret).parent.mkdir(parents=True, exist_ok=True)
    (root / secret).write_text("s3cr3t")
    with pytest.raises(PackagingError, match="usually hold credentials") as info:
        build_package(root)
    assert secret.split("/")[0] in str(info.value)
    assert info.value.exit_code == 2


def test_secret_allowed_explicitly(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "server.pem").write_text("public cert")
    with build_package(root, PackageLimits(allow_secrets=("server.pem",))) as package:
        assert "server.pem" in [f["path"] for f in package.files]


def test_size_limit_names_the_largest(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 200_000)
    with pytest.raises(PackagingError, match=r"largest: data/ \(0\.2 MB\)"):
        build_package(root, PackageLimits(max_bytes=100_000))


def test_link_out_of_the_source_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (tmp_path / "outside.txt").write_text("x")
    (root / "link.txt").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(PackagingError, match="outside the source folder"):
        build_package(root)


def _tar_with(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    path = tmp_path / "hostile.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


@pytest.mark.parametrize("name", ["../escape.txt", "/abs/escape.txt", "src/../../escape.txt"])
def test_bootstrap_refuses_paths_outside(tmp_path: Path, name: str) -> None:
    boot = load_bootstrap()
    archive = _tar_with(tmp_path, tarfile.TarInfo(name))
    dest = tmp_path / "out" / "bundle"
    with pytest.raises(boot.BootstrapError, match="outside"):
        boot.safe_extract(archive, dest)
    assert not (tmp_path / "escape.txt").exists() and not dest.exists()


def test_bootstrap_refuses_links(tmp_path: Path) -> None:
    boot = load_bootstrap()
    link = tarfile.TarInfo("src/evil")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(boot.BootstrapError, match="link"):
        boot.safe_extract(_tar_with(tmp_path, link), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bootstrap_extracts_a_real_bundle(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    boot = load_bootstrap()
    with build_package(root) as package:
        boot.safe_extract(package.path, tmp_path / "out")
        assert boot.sha256_of(package.path) == package.digest
    assert (tmp_path / "out" / "src" / "pkg" / "model.py").read_text() == "X = 1\n"


def test_gitignore_and_cloudtrainignore(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 10)
    (root / "data" / "keep.txt").write_text("k")
    (root / "notes.log").write_text("l")
    (root / ".gitignore").write_text("data/\n*.log\n")
    (root / ".cloudtrainignore").write_text("!notes.log\npkg/\n")
    with build_package(root, PackageLimits(exclude=("train.py",))) as package:
        paths = [f["path"] for f in package.files]
    assert paths == [".cloudtrainignore", ".env.example", ".gitignore", "notes.log"]


def test_cli_allow_secret_flag(cli, tmp_path: Path) -> None:
    proj = make_tree(tmp_path / "proj")
    (proj / "server.pem").write_text("public cert")
    refused = cli("plan", str(proj / "train.py"))
    assert refused.returncode == 2 and "server.pem" in refused.stderr and "--allow-secret" in refused.stderr
    allowed = cli("plan", str(proj / "train.py"), "--allow-secret", "*.pem", "-o", "json")
    assert allowed.returncode == 0, allowed.stderr
    assert "server.pem" in allowed.stdout


def test_bootstrap_refuses_huge_members_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boot = load_bootstrap()
    monkeypatch.setattr(boot, "MAX_MEMBER_BYTES", 1000)
    archive = _tar_with(tmp_path, tarfile.TarInfo("src/huge.bin"), b"\0" * 5000)
    with pytest.raises(boot.BootstrapError, match="over the 1000 limit"):
        boot.safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bootstrap_refuses_a_bomb_by_total_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boot = load_bootstrap()
    monkeypatch.setattr(boot, "MAX_TOTAL_BYTES", 10_000)
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as tar:  # 20 zero-filled members: tiny compressed, large expanded
        for i in range(20):
            info = tarfile.TarInfo(f"src/{i}.bin")
            info.size = 1000
            tar.addfile(info, io.BytesIO(b"\0" * 1000))
    assert path.stat().st_size < 2000
    with pytest.raises(boot.BootstrapError, match="expands to more than"):
        boot.safe_extract(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_nested_gitignore_is_relative_to_its_folder(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "pkg" / ".gitignore").write_text("*.tmp\n/local.txt\n")
    (root / "pkg" / "a.tmp").write_text("x")
    (root / "pkg" / "local.txt").write_text("x")
    (root / "local.txt").write_text("kept: the nested rule is anchored to pkg/")
    (root / "b.tmp").write_text("kept: outside pkg/")
    with build_package(root) as package:
        paths = [f["path"] for f in package.files]
    assert paths == [".env.example", "b.tmp", "local.txt", "pkg/.gitignore", "pkg/model.py", "train.py"]


def test_workers_get_the_exit_guard_and_the_images_own_sitecustomize(tmp_path: Path) -> None:
    """The bundle's lib/ leads a worker's PYTHONPATH: its sitecustomize installs cloudtrain's exit guard (gloo
    threads finish before finalization) and still runs the sitecustomize it shadows, as an image may have one."""
    root = make_tree(tmp_path / "src")
    with build_package(root) as package:
        load_bootstrap().safe_extract(package.path, tmp_path / "out")
    image_site = tmp_path / "image-site"
    image_site.mkdir()
    (image_site / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n")
    probe = ("import os, sys, atexit, cloudtrain.node.exit_guard as g\n"
             "print(sys.modules['sitecustomize'].__file__, g._installed, os.environ.get('IMAGE_SITECUSTOMIZE'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "out" / "lib"), str(image_site)])}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.split() == [str(tmp_path / "out" / "lib" / "sitecustomize.py"), "True", "ran"]


def test_exit_guard_waits_only_where_gloo_could_run() -> None:
    from tests.emulators import free_port

    code = ("import os, sys, cloudtrain.node.exit_guard as g\n"
            "slept = []\n"
            "g.time.sleep = slept.append  # record the pauses instead of taking them\n"
            "g.settle(); alone = list(slept)\n"
            "import torch.distributed as dist\n"
            "g.settle(); no_group = list(slept)\n"
            "os.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT=sys.argv[1])\n"
            "dist.init_process_group('gloo'); dist.barrier()  # the workers have run (and named themselves)\n"
            "names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]\n"
            "slept.clear(); g.settle()\n"
            "print(alone == no_group == [], names.count(g.GLOO_WORKER_THREAD) > 0, slept[:1], set(slept))\n"
            "dist.destroy_process_group()\n")
    result = subprocess.run([sys.executable, "-c", code, str(free_port())], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    # no torch.distributed, or torch without a gloo group: no pause at all. With a group: its gloo workers carry
    # the name the guard looks for (a torch that renamed them would leave the guard blind), and the guard pauses in
    # short steps (GIL released)
    assert result.stdout.split() == ["True", "True", "[0.01]", "{0.01}"]


@pytest.mark.parametrize("imports_torch", [True, False])
def test_exit_guard_spares_a_torch_process_the_final_collections(imports_torch: bool) -> None:
    """A process that imported torch ends with its heap frozen (finalization's full collections skip it: 0.85 s ->
    0.28 s per worker after a DDP step, benchmarks/local_job.py), after one collection that still finalizes the
    garbage there was. Other processes end as Python ends them."""
    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))  # registered first: runs last\n"
            "import cloudtrain.node.exit_guard as g\n"
            "g.install()\n"
            + ("import torch\n" if imports_torch else "") +
            "gc.disable()  # no automatic collection: only an explicit one (or finalization's) finds the cycle\n"
            "class Cycle:\n"
            "    def __del__(self): print('finalized', flush=True)\n"
            "c = Cycle(); c.me = c; del c\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"frozen {imports_torch}" in lines
    assert "finalized" in lines  # the cycle's __del__ ran either way


def test_bundle_bytes_are_what_tarfile_writes(tmp_path: Path) -> None:
    """cloudtrain writes tar headers itself (the common case ~10x faster than tarfile's generic code): the stream
    must stay byte for byte what tarfile writes in PAX format, long and non-ASCII names included."""
    import gzip

    root = make_tree(tmp_path / "src")
    (root / ("long_" * 30 + ".py")).write_text("x = 1\n")
    (root / "ünïcode.py").write_text("y = 2\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    with build_package(root) as package:
        ours = gzip.decompress(package.path.read_bytes())
    reference = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(ours)) as src, \
            tarfile.open(fileobj=reference, mode="w", format=tarfile.PAX_FORMAT) as dst:
        assert any(len(m.name.encode()) > 100 for m in src.getmembers())  # the pax-header path is covered
        for member in src.getmembers():
            info = tarfile.TarInfo(member.name)
            info.size, info.mode, info.mtime, info.uid, info.gid = member.size, member.mode, 0, 0, 0
            info.uname = info.gname = ""
            dst.addfile(info, src.extractfile(member))
    assert ours == reference.getvalue()


def test_tar_headers_match_tarfile_for_every_size_and_name() -> None:
    from cloudtrain.bundle.tarstream import _tarfile_header, header

    for name in ("a", "src/pkg/x.py", "x" * 100, "y" * 101, "src/ünï.py"):
        for size in (0, 1, 511, 512, 10**9, 8**11 - 1, 8**11):  # from 8 GiB on, tarfile adds a pax size record
            for mode in (0o644, 0o755):
                assert header(name, size, mode) == _tarfile_header(name, size, mode), (name, size, mode)


def test_a_name_that_is_not_utf8_is_refused_alike_by_plan_and_submit(tmp_path: Path) -> None:
    """Issue 38.17: caf\\xe9.txt (Latin-1, from an old archive) in the source ended `submit` in UnicodeEncodeError:
    the plan's seal and the job's record hold names as UTF-8 text. plan and submit (one planning path) refuse it
    alike, naming the file as \\xNN and the fix, and record nothing; left out with .cloudtrainignore, the job runs."""
    from tests.support import Cloudtrain

    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "train.py").write_text("print('trained')\n")
    (proj / os.fsdecode(b"caf\xe9.txt")).write_text("old")
    (proj / "data" / os.fsdecode(b"\xff")).mkdir()
    ct = Cloudtrain(tmp_path / "home", proj)
    for command in ("plan", "submit"):
        run = ct(command, "train.py", "-p", "local", check=False)
        assert run.returncode == 2, run.stdout + run.stderr
        assert run.stderr.startswith("error: source_dir: cannot package caf\\xe9.txt, data/\\xff/: names that are not "
                                     "UTF-8 text") and "Traceback" not in run.stderr, run.stderr
        assert "rename it" in run.stderr and ".cloudtrainignore" in run.stderr
    assert json.loads(ct("list", "-o", "json").stdout) == []
    (proj / ".cloudtrainignore").write_text("caf*.txt\ndata/\n")
    handle = ct("submit", "train.py", "-p", "local", "--detach").stdout.strip()
    assert ct("wait", handle, "--timeout", "120").returncode == 0
    assert "trained" in ct("logs", handle).stdout


def test_names_that_are_not_utf8_outside_the_package_are_shown_escaped(tmp_path: Path) -> None:
    """Siblings of 38.17: a FIFO the package leaves out, a spec file (-f) and a saved plan (`plan -o json >
    pl\\xe9.json` in the project, then `submit --plan`) whose names are not UTF-8 are named as \\xNN in the plan, not
    a UnicodeEncodeError."""
    from tests.conftest import cli_env
    from tests.support import Cloudtrain

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('trained')\n")
    os.mkfifo(proj / os.fsdecode(b"pipe\xe9"))
    spec = tmp_path / os.fsdecode(b"caf\xe9.yaml")
    spec.write_text(f"script: train.py\nsource_dir: {proj}\n")
    ct = Cloudtrain(tmp_path / "home", proj)
    shown = ct("plan", "-f", str(spec), "-p", "local").stdout
    assert "left out pipe\\xe9 (a FIFO" in shown and "caf\\xe9.yaml (with the flags given" in shown, shown
    saved = proj / os.fsdecode(b"pl\xe9.json")
    with saved.open("w") as out:
        subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train.py", "-p", "local", "-o", "json"],
                       cwd=proj, env=cli_env(tmp_path / "home"), stdout=out, check=True, timeout=120)
    handle = ct("submit", "--plan", saved.name, "--detach").stdout.strip()
    assert ct("wait", handle, "--timeout", "120").returncode == 0


# -- issue 50.8: empty files are packaged; only a plan (or a plan's beginning) is left out as one ------------------


def test_empty_files_are_packaged_and_count_toward_the_file_limit(tmp_path: Path) -> None:
    """Every empty .json was left out as "a plan still being saved", one note line each: 51,000 of them made a
    51,000-line plan of a 1-file package, and package.max_files was never reached."""
    root = make_tree(tmp_path / "src")
    (root / "data").mkdir()
    for n in range(60):
        (root / "data" / f"{n:02}.json").write_bytes(b"")
    (root / "empty.yaml").write_bytes(b"")
    with build_package(root) as package:
        shipped = {f["path"] for f in package.files}
        assert {"data/00.json", "data/59.json", "empty.yaml"} <= shipped, sorted(shipped)[:5]
        assert package.left_out == [] and package.notes() == []
    with pytest.raises(PackagingError, match=r"source folder too large: 64 files, .* \(limits: 50 files"):
        build_package(root, PackageLimits(max_files=50))  # what package.max_files sets


def test_only_a_saved_plan_or_its_beginning_is_left_out_and_said_in_one_line(cli, tmp_path: Path) -> None:
    """A real saved plan (`plan -o json`, `-o yaml`) and the beginning of one (being written, or cut short at any
    byte) are left out; a complete JSON file that only starts like one (a config with provider and job_id) ships.
    What was left out is one note line: the count and the first few names."""
    outside = tmp_path / "planned"
    outside.mkdir()
    (outside / "train.py").write_text("print('hi')\n")
    plans = {}
    for form in ("json", "yaml"):
        out = cli("plan", "train.py", "-o", form, cwd=outside)
        assert out.returncode == 0, out.stderr
        plans[form] = out.stdout.encode()
    root = make_tree(tmp_path / "src")
    (root / "plan.json").write_bytes(plans["json"])
    (root / "plan.yaml").write_bytes(plans["yaml"])
    cuts = (1, 2, 12, 30, 200, len(plans["json"]) // 2, len(plans["json"]) - 2)
    for cut in cuts:
        (root / f"cut-{cut:06}.json").write_bytes(plans["json"][:cut])
    (root / "cut.yaml").write_bytes(plans["yaml"][:20])
    (root / "config.json").write_text('{"provider": "openai", "job_id": "ft-1", "lr": 0.1}\n')
    with build_package(root) as package:
        left = [f"cut-{cut:06}.json" for cut in cuts] + ["cut.yaml", "plan.json", "plan.yaml"]
        assert package.left_out == left
        assert [f["path"] for f in package.files] == [".env.example", "config.json", "pkg/model.py", "train.py"]
        [note] = package.notes()
        assert note.startswith("package: left out 10 files: cut-000001.json, cut-000002.json, cut-000012.json, "
                               "cut-000030.json, cut-000200.json and 3 more (the beginning of a saved plan"), note
        assert note.endswith("; plan.json, plan.yaml (a cloudtrain spec file or saved plan: nodes get its settings "
                             "through the request)"), note
