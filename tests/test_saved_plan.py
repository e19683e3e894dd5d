"""Issue 28.6: a saved plan is what runs, or it is refused.

`cloudtrain plan ... -o json > plan.json` is reviewed, then `submit --plan plan.json` submits it. Before, submit
planned again from the file's `spec` and checked only the bundle digest and the age: an edited spec (arguments,
environment) ran while the file still showed the reviewed request and node commands. Now every part of the plan is
bound to the digests printed with it and the plan made again must come out as the file shows it; a difference is
refused naming where it is. A file that is not a plan at all (nested 100,000 deep, not an object, truncated ...) is
refused with exit 2 and no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.plan.seal import SEAL, seal_parts
from cloudtrain.providers.local.jobdb import JobDB
from tests.conftest import cli_env, status_json, wait_for

HF = "hf_abcdefghijklmnopqrstu"


@pytest.fixture
def saved(ct_home: Path, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    path = src / "plan.json"
    with open(path, "w") as out:
        result = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train.py", "--nodes", "2", "--env",
                                 f"HF_TOKEN={HF}", "-o", "json", "--", "--epochs", "1"], cwd=src, env=cli_env(ct_home),
                                stdout=out, stderr=subprocess.PIPE, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    return path


def submit(cli, saved: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("submit", "--plan", str(saved), "--env", f"HF_TOKEN={HF}", *extra, cwd=saved.parent)


def refused(cli, ct_home: Path, saved: Path) -> str:
    out = submit(cli, saved, "--detach")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert not (ct_home / "jobs.db").exists(), "nothing recorded"
    return out.stderr


def edit(saved: Path, change: Callable[[dict[str, Any]], None], reseal: bool = False) -> None:
    data = json.loads(saved.read_text())
    change(data)
    if reseal:  # as someone who knows the digests would: the plan made again still has to match
        data[SEAL] = seal_parts(data)
    saved.write_text(json.dumps(data, indent=2))


def test_the_saved_plan_submits_as_planned(cli, saved: Path) -> None:
    out = submit(cli, saved, "--dry-run", "-o", "json")
    assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout)
    planned = json.loads(saved.read_text())
    for key in ("request", "nodes", "spec", "package", "staging"):
        assert again[key] == planned[key], key


@pytest.mark.parametrize(
    ("change", "named"),
    [(lambda d: d["spec"].update(args=["--epochs", "1000"]), "spec.args differs from what was planned"),
     (lambda d: d["spec"]["env"].update(EXTRA="1"), "spec.env differs"),
     (lambda d: d["nodes"][1]["torchrun"].append("--evil"), "nodes[1] differs"),
     (lambda d: d["request"].update(max_restarts=5), "request.max_restarts differs"),
     (lambda d: d.update(created_at=d["created_at"] + 3600), "created_at differs"),
     (lambda d: d.pop("staging"), "staging.bundle, staging.prefix, staging.store differ")],
    ids=["spec-args", "spec-env", "node-command", "request", "newer", "removed"])
def test_an_edited_saved_plan_is_refused_naming_the_field(cli, ct_home: Path, saved: Path,
                                                          change: Callable[[dict[str, Any]], None], named: str) -> None:
    edit(saved, change)
    stderr = refused(cli, ct_home, saved)
    assert "was changed after it was planned" in stderr and named in stderr, stderr
    assert "a saved plan is submitted exactly as planned, or not at all" in stderr


def test_an_edit_with_the_digests_made_again_is_still_refused(cli, ct_home: Path, saved: Path) -> None:
    """The digests catch an edit; what catches a forger is the plan made again from the file's spec, which must
    come out as the request and node commands the file shows."""
    edit(saved, lambda d: d["spec"].update(args=["--epochs", "1000"]), reseal=True)
    stderr = refused(cli, ct_home, saved)
    assert "no longer plans as it shows" in stderr and "nodes[0].torchrun" in stderr, stderr
    saved_copy = json.loads(saved.read_text())
    assert saved_copy["spec"]["args"] == ["--epochs", "1000"]


@pytest.mark.parametrize(
    "content",
    ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000, '{"x": ' + "[" * 70 + "]" * 70 + "}",
     "[]", '"plan"', "{", "\ufeff{}", '{"provider": "local", "job_id": "x", "package": {"digest": "d"}, "spec": {}, '
     '"created_at": NaN, "seal": {}}', '{"provider": "local", "job_id": "x", "package": {"digest": "d"}, "spec": {}, '
     '"created_at": 1e12, "seal": []}', ""],
    ids=["nested-lists", "nested-objects", "deep-value", "list", "string", "truncated", "bom", "nan", "no-seal",
         "empty"])
def test_a_malformed_saved_plan_exits_2_without_a_traceback(cli, ct_home: Path, tmp_path: Path, content: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    out = cli("submit", "--plan", str(path), "--detach")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith("error: --plan:") and "fix: " in out.stderr, out.stderr
    assert not (ct_home / "jobs.db").exists()


# -- issue 38.4-38.8: refused or accepted for the wrong reasons, a killed submit ------------------------------------

YEAR = 365 * 86400


def project_with(tmp_path: Path, code: str = "print('trained', flush=True)\n") -> Path:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "train.py").write_text(code)
    return src


def patched(ct_home: Path, cwd: Path, prelude: str, *args: str, out: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, after ``prelude`` ran in it (a clock that is wrong, a kill at one point)."""
    code = f"import os, runpy, signal, subprocess, sys, time\n{prelude}\nsys.argv = ['cloudtrain', *sys.argv[1:]]\n" \
           "runpy.run_module('cloudtrain', run_name='__main__')\n"
    with open(out, "w") if out else open(os.devnull, "w") as sink:
        return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=cli_env(ct_home), text=True,
                              stdout=sink if out else subprocess.PIPE, stderr=subprocess.PIPE, timeout=240)


def save_plan(ct_home: Path, src: Path, name: str, *args: str, python: str = sys.executable) -> Path:
    """`cloudtrain plan ... -o json > NAME` in the project, as a user saves one."""
    with open(src / name, "w") as out:
        done = subprocess.run([python, "-m", "cloudtrain", "plan", "train.py", *args, "-o", "json"], cwd=src,
                              env=cli_env(ct_home), stdout=out, stderr=subprocess.PIPE, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return src / name


def test_plans_saved_in_the_project_since_leave_a_saved_plan_as_it_was(cli, ct_home: Path, tmp_path: Path) -> None:
    """38.4: a second plan saved beside the first (for another provider), an export, and a plan saved through
    `| tee` were each refused: the first plan's package.left_out (files that never ship) named them, or the tee'd
    plan, empty while it was being planned, was packaged. Nothing the job runs changed."""
    src = project_with(tmp_path)
    first = save_plan(ct_home, src, "plan.json")
    save_plan(ct_home, src, "plan-slurm.json", "-p", "slurm", "--set", f"providers.slurm.staging={tmp_path}/shared")
    exported = cli("plan", "train.py", "-p", "aws", "--set", "providers.aws.region=us-east-1", "--set",
                   "providers.aws.role=arn:aws:iam::123456789012:role/x", "--set", "providers.aws.bucket=my-bucket",
                   "--export", "exported", cwd=src)
    assert exported.returncode == 0, exported.stderr
    teed = subprocess.run(f"{sys.executable} -m cloudtrain plan train.py -o json | tee plan-tee.json", shell=True,
                          cwd=src, env=cli_env(ct_home), capture_output=True, text=True, timeout=240)
    assert teed.returncode == 0 and json.loads((src / "plan-tee.json").read_text())["job_id"], teed.stderr
    for saved_plan in (first, src / "plan-tee.json"):
        again = cli("submit", "--plan", saved_plan.name, "--dry-run", "-o", "json", cwd=src)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["package"]["files"] == [{"path": "train.py", "size": 29}]
    (src / "train.py").write_text("print('changed')\n")  # what the job runs still binds it
    changed = cli("submit", "--plan", first.name, "--detach", cwd=src)
    assert changed.returncode == 2 and "the source changed since 'plan.json' was planned" in changed.stderr


def test_one_interpreter_by_another_of_its_names_submits_the_plan_it_saved(cli, ct_home: Path,
                                                                            tmp_path: Path) -> None:
    """38.5: `cloudtrain plan` (its #! says python3) saved a plan that `python -m cloudtrain submit --plan` refused,
    nodes[0].argv[0] "would differ": python vs python3, the same file."""
    folder = Path(sys.executable).parent
    names = [folder / n for n in ("python", "python3") if (folder / n).exists()]
    if len(names) < 2 or not os.path.samefile(*names):
        pytest.skip("this interpreter has no second name in its folder")
    src = project_with(tmp_path)
    for planner, submitter in (names, names[::-1]):
        saved_plan = save_plan(ct_home, src, "plan.json", python=str(planner))
        again = subprocess.run([str(submitter), "-m", "cloudtrain", "submit", "--plan", "plan.json", "--dry-run",
                                "-o", "json"], cwd=src, env=cli_env(ct_home), capture_output=True, text=True,
                               timeout=240)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["nodes"] == json.loads(saved_plan.read_text())["nodes"]


def test_a_plan_dated_ahead_of_this_clock_is_refused(cli, ct_home: Path, tmp_path: Path) -> None:
    """38.6: planned on a machine whose clock ran a year ahead, the plan was accepted (and never grew old). A few
    minutes of skew between two clocks are allowed."""
    src = project_with(tmp_path)
    for ahead, name in ((YEAR, "ahead.json"), (120, "skewed.json")):
        planned = patched(ct_home, src, f"real = time.time\ntime.time = lambda: real() + {ahead}", "plan", "train.py",
                          "-o", "json", out=src / name)
        assert planned.returncode == 0, planned.stderr
    out = cli("submit", "--plan", "ahead.json", "--detach", cwd=src)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: --plan: 'ahead.json' is dated ") and "(created_at)" in out.stderr
    assert "365d ahead of this machine's clock" in out.stderr and "fix: set the clock right" in out.stderr
    assert not (ct_home / "jobs.db").exists()
    skewed = cli("submit", "--plan", "skewed.json", "--dry-run", "-o", "json", cwd=src)
    assert skewed.returncode == 0, skewed.stderr


def legs_plan(ct_home: Path, src: Path, tmp_path: Path) -> Path:
    return save_plan(ct_home, src, "legs.json", "-p", "local,slurm", "--set",
                     f"providers.slurm.staging={tmp_path}/shared")


def test_a_plan_saved_for_a_provider_list_submits_as_planned(cli, ct_home: Path, tmp_path: Path) -> None:
    """38.7: `plan -p local,slurm -o json > plan.json` was refused as "not a plan saved by this version", with
    what the user just did as the fix. Now it submits as `submit -p local,slurm` would: the first leg that takes it,
    with its fallback chain; submitted again it is the same job; edited legs are refused naming them."""
    src = project_with(tmp_path)
    saved_plan = legs_plan(ct_home, src, tmp_path)
    legs = json.loads(saved_plan.read_text())["legs"]
    shown = cli("submit", "--plan", "legs.json", "--dry-run", "-o", "json", cwd=src)
    assert shown.returncode == 0, shown.stderr
    assert [leg["plan"]["nodes"] for leg in json.loads(shown.stdout)["legs"]] == [leg["plan"]["nodes"] for leg in legs]
    out = cli("submit", "--plan", "legs.json", "--detach", cwd=src)
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip()
    assert handle == f"local://{legs[0]['plan']['job_id']}"
    assert cli("wait", handle, "--timeout", "120").returncode == 0
    again = cli("submit", "--plan", "legs.json", "--detach", cwd=src)
    assert again.returncode == 0 and again.stdout.strip() == handle, again.stderr
    listed = json.loads(cli("list", "-o", "json").stdout)
    assert [job["handle"] for job in listed] == [handle]
    status = cli("status", handle)
    assert "lineage:" in status.stdout and f"0. {handle}  on local: submitted" in status.stdout, status.stdout

    wrong = cli("submit", "--plan", "legs.json", "-p", "slurm", "--detach", cwd=src)
    assert wrong.returncode == 2 and "a plan for the provider list local,slurm, not slurm" in wrong.stderr
    edit(saved_plan, lambda d: d["legs"].reverse())  # slurm first: each leg's plan is intact, their order is not
    reordered = cli("submit", "--plan", "legs.json", "--detach", cwd=src)
    assert reordered.returncode == 2 and "Traceback" not in reordered.stderr, reordered.stderr
    assert "was changed after it was planned: legs[0], legs[1] differ" in reordered.stderr
    assert "fix: plan again" in reordered.stderr
    edit(saved_plan, lambda d: d["legs"][1]["plan"]["spec"].update(args=["--evil"]))
    edited = cli("submit", "--plan", "legs.json", "--detach", cwd=src)
    assert edited.returncode == 2 and "legs[1].plan.spec.args differs" in edited.stderr, edited.stderr


KILL_BEFORE_START = ("from cloudtrain.providers.local.provider import LocalProvider\n"
                     "LocalProvider._start_supervisor = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)")
KILL_AT_START = ("class Dying(subprocess.Popen):\n"  # the supervisor started, its pid and environment not handed
                 "    def __init__(self, argv, *a, **k):\n"
                 "        super().__init__(argv, *a, **k)\n"
                 "        if 'cloudtrain.providers.local.supervisor' in argv:\n"
                 "            os.kill(os.getpid(), signal.SIGKILL)\n"
                 "subprocess.Popen = Dying")


@pytest.mark.parametrize(("kill", "kind", "settle"), [(KILL_BEFORE_START, "plan", False),
                                                     (KILL_AT_START, "plan", False),
                                                     (KILL_BEFORE_START, "plan", True),
                                                     (KILL_BEFORE_START, "legs", False)],
                         ids=["before-supervisor", "at-supervisor-start", "status-first", "provider-list"])
def test_a_submit_killed_after_recording_the_job_is_started_by_the_next(cli, ct_home: Path, tmp_path: Path,
                                                                        kill: str, kind: str, settle: bool) -> None:
    """38.8: `submit --plan` SIGKILLed after it recorded the job and before its supervisor ran it: the same
    `submit --plan` again printed the handle (exit 0) and the job stayed pending with nothing to start it (for two
    minutes, then failed). Now the next submit of the plan starts it, at once or after `status` has said that it
    never started (``settle``)."""
    src = project_with(tmp_path)
    saved_plan = legs_plan(ct_home, src, tmp_path) if kind == "legs" else save_plan(ct_home, src, "plan.json")
    data = json.loads(saved_plan.read_text())
    handle = f"local://{(data['legs'][0]['plan'] if kind == 'legs' else data)['job_id']}"
    killed = patched(ct_home, src, kill, "submit", "--plan", saved_plan.name, "--detach")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert JobDB(ct_home / "jobs.db").get(handle.split("//")[1]) is not None, "recorded before it was killed"
    if settle:
        wait_for(lambda: status_json(cli, handle)["state"] == "failed", timeout=60)
        assert "never started (the submitting command was interrupted?): submit again" in \
            status_json(cli, handle)["message"]
    again = cli("submit", "--plan", saved_plan.name, "--detach", cwd=src)
    assert again.returncode == 0 and again.stdout.strip() == handle, again.stderr
    waited = cli("wait", handle, "--timeout", "90")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "trained" in cli("logs", handle).stdout
    assert [job["handle"] for job in json.loads(cli("list", "-o", "json").stdout)] == [handle]
