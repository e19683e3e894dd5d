"""Issue 51.6: a leg of a fallback list whose provider's extra is not installed here.

`-p aws,local` without boto3: `plan` refused the whole list (exit 2, "provider 'aws' needs boto3"), and so did
`submit -p aws,local` and `submit --plan` of a list saved where boto3 was: the first leg stopped it, local was never
tried. Now the plan names that leg with its `pip install` (text and JSON), a submit skips it saying so on stderr and
runs on the next leg; only when no leg can run is it an error (exit 2, each leg named with its fix, nothing sent). A
single provider not installed is refused as before.

boto3 (and torch, for "no leg can run") is hidden from the CLI's own process only, as tests/test_cli_errors.py hides
torch: ``sys.modules[name] = None`` before cloudtrain starts. The local job runs for real (it prints and ends)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import CloudtrainError, ProviderNotInstalled
from cloudtrain.jobs import fallback
from cloudtrain.jobs.fallback import Leg, Refused, Skip, Unusable, try_legs
from tests.conftest import cli_env

AWS_FIX = "pip install 'cloudtrain[aws]'"
AWS_SETTINGS = {"CLOUDTRAIN_AWS_ROLE": "arn:aws:iam::123456789012:role/cloudtrain-tests",
                "CLOUDTRAIN_AWS_BUCKET": "my-bucket", "AWS_REGION": "us-east-1"}


def cli(home: Path, cwd: Path, *args: str, hide: tuple[str, ...] = ("boto3",),
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, with the modules ``hide`` not importable there (an extra not installed)."""
    code = "import runpy, sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in hide) + \
           "sys.argv = ['cloudtrain', *sys.argv[1:]]\nrunpy.run_module('cloudtrain', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env={**cli_env(home), **(env or {})},
                          capture_output=True, text=True, timeout=240)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("print('trained', flush=True)\n")
    return folder


def test_plan_names_the_leg_not_installed_with_its_fix(ct_home: Path, src: Path) -> None:
    text = cli(ct_home, src, "plan", "train.py", "-p", "aws,local")
    assert text.returncode == 0, text.stderr
    assert "leg 1/2: aws (not installed here: a submit skips it)" in text.stdout
    assert "provider 'aws' needs boto3, which is not installed" in text.stdout and f"fix: {AWS_FIX}" in text.stdout
    assert "leg 2/2: local (tried first)" in text.stdout

    shown = cli(ct_home, src, "plan", "train.py", "-p", "aws,local", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    legs = json.loads(shown.stdout)["legs"]
    assert legs[0] == {"provider": "aws", "region": None, "not_installed": {
        "message": "provider 'aws' needs boto3, which is not installed", "remedy": AWS_FIX}}
    assert legs[1]["provider"] == "local" and legs[1]["plan"]["provider"] == "local"
    assert f"note: aws: not installed here ({AWS_FIX}); a submit skips it" in shown.stderr
    assert not (ct_home / "jobs.db").exists()


def test_submit_skips_the_leg_not_installed_and_runs_on_the_next(ct_home: Path, src: Path) -> None:
    out = cli(ct_home, src, "submit", "train.py", "-p", "aws,local", "--detach")
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip()
    assert handle.startswith("local://"), out.stdout
    assert f"aws: not installed here ({AWS_FIX}); trying local" in out.stderr
    assert cli(ct_home, src, "wait", handle, "--timeout", "120").returncode == 0
    status = cli(ct_home, src, "status", handle)
    assert status.returncode == 0, status.stderr
    assert f"on local: submitted (aws: not installed here ({AWS_FIX}))" in status.stdout, status.stdout


@pytest.mark.parametrize("command", ["plan", "submit"])
def test_no_leg_can_run_is_exit_2_naming_each_fix(ct_home: Path, src: Path, command: str) -> None:
    out = cli(ct_home, src, command, "train.py", "-p", "aws,local", *(["--detach"] if command == "submit" else []),
              hide=("boto3", "torch"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stderr.startswith("error: --provider: no provider of the fallback "
                                                                   "list can run here")
    assert f"aws: not installed here ({AWS_FIX})" in out.stderr
    assert "local: not installed here (pip install 'cloudtrain[local]')" in out.stderr
    assert f"fix: {AWS_FIX} or pip install 'cloudtrain[local]'" in out.stderr
    assert not (ct_home / "jobs.db").exists() and not (ct_home / "store").exists(), "nothing submitted"


def test_one_provider_not_installed_is_refused_as_before(ct_home: Path, src: Path) -> None:
    for command in ("plan", "submit"):
        out = cli(ct_home, src, command, "train.py", "-p", "aws")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "--provider: provider 'aws' needs boto3, which is not installed" in out.stderr
        assert f"fix: {AWS_FIX}" in out.stderr
    assert not (ct_home / "jobs.db").exists()


def save(ct_home: Path, src: Path, hide: tuple[str, ...]) -> Path:
    planned = cli(ct_home, src, "plan", "train.py", "-p", "aws,local", "-o", "json", hide=hide, env=AWS_SETTINGS)
    assert planned.returncode == 0, planned.stderr
    (src / "legs.json").write_text(planned.stdout)
    return src / "legs.json"


def test_a_list_saved_where_aws_was_installed_submits_on_local_here(ct_home: Path, src: Path) -> None:
    saved = save(ct_home, src, hide=())
    legs = json.loads(saved.read_text())["legs"]
    assert [leg["plan"]["provider"] for leg in legs] == ["aws", "local"]  # both planned where boto3 was
    shown = cli(ct_home, src, "submit", "--plan", "legs.json", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "leg 1/2: aws (not installed here: a submit skips it)" in shown.stdout
    assert "leg 2/2: local (tried first)" in shown.stdout
    out = cli(ct_home, src, "submit", "--plan", "legs.json", "--detach")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"local://{legs[1]['plan']['job_id']}"
    assert f"aws: not installed here ({AWS_FIX}); trying local" in out.stderr
    assert cli(ct_home, src, "wait", out.stdout.strip(), "--timeout", "120").returncode == 0
    again = cli(ct_home, src, "submit", "--plan", "legs.json", "--detach")  # the same file is the same job
    assert again.returncode == 0 and again.stdout.strip() == out.stdout.strip(), again.stderr
    none = cli(ct_home, src, "submit", "--plan", "legs.json", "--detach", hide=("boto3", "torch"))
    assert none.returncode == 2 and "no provider of the fallback list can run here" in none.stderr, none.stderr


def test_a_list_saved_where_aws_was_not_installed_never_submits_it(ct_home: Path, src: Path) -> None:
    """The saved leg holds no plan: nothing reviewed to run there, even where boto3 is installed now."""
    saved = save(ct_home, src, hide=("boto3",))
    legs = json.loads(saved.read_text())["legs"]
    assert "plan" not in legs[0] and legs[0]["not_installed"]["remedy"] == AWS_FIX
    out = cli(ct_home, src, "submit", "--plan", "legs.json", "--detach", hide=(), env=AWS_SETTINGS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"local://{legs[1]['plan']['job_id']}"
    assert f"aws: not installed where 'legs.json' was planned ({AWS_FIX}); trying local" in out.stderr
    assert cli(ct_home, src, "wait", out.stdout.strip(), "--timeout", "120").returncode == 0

    data = json.loads(saved.read_text())
    data["legs"][0]["not_installed"]["remedy"] = "pip install evil"  # sealed as the rest of the list
    saved.write_text(json.dumps(data))
    edited = cli(ct_home, src, "submit", "--plan", "legs.json", "--detach")
    assert edited.returncode == 2 and "legs[0] differs" in edited.stderr, edited.stderr


# -- the decision itself, in this process ---------------------------------------------------------------------------


class _Provider:
    name = "fake"

    def capacity_error(self, error: CloudtrainError) -> str | None:
        return "quota" if "quota" in error.message else None


def _missing(name: str) -> ProviderNotInstalled:
    return ProviderNotInstalled(f"provider {name!r} needs {name}sdk, which is not installed", field="--provider",
                                remedy=f"pip install 'cloudtrain[{name}]'")


def test_try_legs_skips_legs_not_installed_and_says_so() -> None:
    legs = [Leg("aws", "us-east-1"), Leg("gcp"), Leg("local")]
    said: list[str] = []

    def attempt(leg: Leg) -> tuple[Any, Any]:
        if leg.provider == "aws":
            raise _missing("aws")
        if leg.provider == "gcp":
            raise Skip(Unusable(leg, "gone", "pip install 'cloudtrain[gcp]'", where="where x.json was planned"))
        return _Provider(), "local://job"

    _provider, handle, index, refused = try_legs(legs, attempt, log=said.append)
    assert (handle, index) == ("local://job", 2)
    assert said == [f"aws us-east-1: not installed here ({AWS_FIX}); trying gcp",
                    "gcp: not installed where x.json was planned (pip install 'cloudtrain[gcp]'); trying local"]
    assert refused == [f"aws us-east-1: not installed here ({AWS_FIX})",
                       "gcp: not installed where x.json was planned (pip install 'cloudtrain[gcp]')"]


def test_try_legs_with_no_leg_to_run() -> None:
    legs = [Leg("aws"), Leg("gcp")]
    def none(leg: Leg) -> tuple[Any, Any]:
        raise _missing(leg.provider)

    with pytest.raises(ProviderNotInstalled) as every:  # none installed: exit 2, nothing was sent
        try_legs(legs, none, log=lambda _m: None)
    assert every.value.exit_code == 2 and every.value.remedy == f"{AWS_FIX} or pip install 'cloudtrain[gcp]'"
    assert f"aws: not installed here ({AWS_FIX}); gcp: not installed here" in every.value.message

    def mixed(leg: Leg) -> tuple[Any, Any]:
        if leg.provider == "aws":
            raise _missing("aws")
        raise Refused(_Provider(), CloudtrainError("over quota"))  # type: ignore[arg-type]  # a fake provider

    with pytest.raises(CloudtrainError) as both:
        try_legs(legs, mixed, log=lambda _m: None)
    assert not isinstance(both.value, ProviderNotInstalled)
    assert both.value.message == ("no provider of the fallback list took the job: aws: not installed here "
                                  f"({AWS_FIX}); gcp refused: quota")
    assert both.value.remedy is not None and AWS_FIX in both.value.remedy


def test_a_move_passes_over_legs_not_installed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def get_provider(name: str) -> object:
        if name != "local":
            raise _missing(name)
        return _Provider()

    monkeypatch.setattr("cloudtrain.providers.get_provider", get_provider)
    legs = [Leg("slurm"), Leg("aws"), Leg("gcp"), Leg("local")]
    index, skipped = fallback._installed_from(legs, 1)
    assert index == 3 and [u.leg.provider for u in skipped] == ["aws", "gcp"]
    with pytest.raises(ProviderNotInstalled, match="no provider of the fallback list can run here: gcp: not"):
        fallback._installed_from(legs[:3], 2)
