"""Issue 28.6: a saved plan is what runs, or it is refused.

`cloudtrain plan ... -o json > plan.json` is reviewed, then `submit --plan plan.json` submits it. Before, submit
planned again from the file's `spec` and checked only the bundle digest and the age: an edited spec (arguments,
environment) ran while the file still showed the reviewed request and node commands. Now every part of the plan is
bound to the digests printed with it and the plan made again must come out as the file shows it; a difference is
refused naming where it is. A file that is not a plan at all (nested 100,000 deep, not an object, truncated ...) is
refused with exit 2 and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.plan_seal import SEAL, seal_parts
from tests.conftest import cli_env

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
