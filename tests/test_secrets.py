from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.node.secret_values import MASK, looks_secret, redact, restore_args, split_args
from tests.conftest import SCRIPTS

SECRET = "supersecret-123456"


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                                  "AZURE_STORAGE_CONNECTION_STRING", "github_token", "MY_PRIVATE_KEY", "SECRETKEY",
                                  "MYPASSWORD", "GITHUB_PAT", "MYSQL_PWD", "SENTRY_DSN", "OPENAI_APIKEY",
                                  "AWS_SESSION_TOKEN", "FLASK_SECRET_KEY", "SESSION_COOKIE"])
def test_secret_names(name: str) -> None:
    assert looks_secret(name, "x")


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "OMP_NUM_THREADS", "KEYBOARD_LAYOUT", "CLOUDTRAIN_STRATEGY", "PWD",
                                  "OLDPWD", "PATH", "PYTHONPATH", "TOKENIZERS_PARALLELISM", "MAX_NEW_TOKENS",
                                  "HF_HUB_ENABLE_HF_TRANSFER", "AUTHOR",
                                  # a session's name or a path to a secret is not the secret: nox, desktops, ssh-agent
                                  "NOX_CURRENT_SESSION", "XDG_SESSION_TYPE", "DBUS_SESSION_BUS_ADDRESS",
                                  "SESSION_MANAGER", "SSH_AUTH_SOCK", "DB_PASSWORD_FILE", "KEY_DIR",
                                  "TOKEN_PATH"])
def test_ordinary_names(name: str) -> None:
    assert not looks_secret(name, "1")


def test_secret_values_by_shape() -> None:
    assert looks_secret("ANYTHING", "AKIAABCDEFGHIJKLMNOP")
    assert looks_secret("X", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc==")
    assert redact({"env": {"A": "1", "HF_TOKEN": "hf_x"}, "list": [{"SECRET": "s"}]}) == {
        "env": {"A": "1", "HF_TOKEN": MASK}, "list": [{"SECRET": MASK}]}


def test_name_value_entries_are_judged_by_their_name() -> None:
    """Request lists such as AWS tags and Vertex env ({"Key"/"name": n, "Value"/"value": v}) keep n readable."""
    entries = [{"Key": "team", "Value": "vision"}, {"Key": "api_token", "Value": SECRET},
               {"name": "HF_TOKEN", "value": SECRET}, {"name": "EPOCHS", "value": "3"}]
    assert redact(entries) == [{"Key": "team", "Value": "vision"}, {"Key": "api_token", "Value": MASK},
                               {"name": "HF_TOKEN", "value": MASK}, {"name": "EPOCHS", "value": "3"}]


@pytest.mark.slow
def test_secrets_reach_the_job_but_no_output_record_or_log(cli, ct_home: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(SCRIPTS / "uses_secret.py", proj)
    flags = ["--env", f"WANDB_API_KEY={SECRET}", "--env", "PLAIN=visible"]
    for command in (["plan"], ["plan", "-o", "json"], ["plan", "-o", "yaml"], ["submit", "--dry-run", "-o", "json"]):
        out = cli(*command, str(proj / "uses_secret.py"), *flags)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
    assert "visible" in cli("plan", "-o", "json", str(proj / "uses_secret.py"), *flags).stdout

    run = cli("submit", str(proj / "uses_secret.py"), *flags)
    assert run.returncode == 0, run.stderr
    assert "secret received: True" in run.stdout
    for path in ct_home.rglob("*"):  # job database, logs, status files, staged bundle
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


HF = "h" + "f_" + "Q7" * 17  # assembled: this file holds no token


def test_arguments_and_urls_are_masked_by_shape() -> None:
    """Issue 15.9: secret flags (--hf-token X, --password=X, --token X), known formats anywhere, and the password of
    a URL; a placeholder standing for a secret is shown as is; registered values are masked inside longer text."""
    data = {"env": {"DATABASE_URL": "postgres://u:pw-1234@host/db", "SECRETKEY": "k-123456"},
            "args": ["--hf-token", HF, "--password=pw-secret", "--token", "X", "--epochs", "3", "--lr=0.1",
                     "--db", "mysql://a:b-pass@h", "--key", "@@CLOUDTRAIN_SECRET_ARG_0@@"],
            "command": "python bootstrap.py -- --x k-123456 pw-secret"}
    assert redact(data) == {
        "env": {"DATABASE_URL": f"postgres://u:{MASK}@host/db", "SECRETKEY": MASK},
        "args": ["--hf-token", MASK, f"--password={MASK}", "--token", MASK, "--epochs", "3", "--lr=0.1",
                 "--db", f"mysql://a:{MASK}@h", "--key", "@@CLOUDTRAIN_SECRET_ARG_0@@"],
        "command": f"python bootstrap.py -- --x {MASK} {MASK}"}


def test_secret_arguments_travel_in_the_environment_and_come_back() -> None:
    args = ["--hf-token", HF, "--password=pw-secret", "--epochs", "3", "--db", "hunter2-x", "data/"]
    shown, moved = split_args(args, {"DB_PASSWORD": "hunter2-x"})
    assert shown == ["--hf-token", "@@CLOUDTRAIN_SECRET_ARG_0@@", "--password=@@CLOUDTRAIN_SECRET_ARG_1@@",
                     "--epochs", "3", "--db", "@@CLOUDTRAIN_SECRET_ARG_2@@", "data/"]
    assert moved == {"CLOUDTRAIN_SECRET_ARG_0": HF, "CLOUDTRAIN_SECRET_ARG_1": "pw-secret",
                     "CLOUDTRAIN_SECRET_ARG_2": "hunter2-x"}
    assert restore_args(shown, moved) == args
    assert split_args(["--epochs", "3"]) == (["--epochs", "3"], {})


def test_placeholders_are_restored_in_torchrun_workers_only(tmp_path: Path) -> None:
    """The bundle's lib/sitecustomize.py puts the values back into a worker's sys.argv (torchrun sets
    TORCHELASTIC_RUN_ID for its workers); torchrun itself keeps the placeholders, so its workers' command lines (ps)
    hold none of the values."""
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "cloudtrain" / "data" / "sitecustomize.py", lib)
    script = tmp_path / "show.py"
    script.write_text("import sys; print(sys.argv[1:])\n")
    base = {"PATH": os.environ["PATH"], "CLOUDTRAIN_SECRET_ARG_0": HF,
            "PYTHONPATH": os.pathsep.join([str(lib), str(Path(__file__).resolve().parents[1])])}
    for env, expected in ((base, "@@CLOUDTRAIN_SECRET_ARG_0@@"), ({**base, "TORCHELASTIC_RUN_ID": "r"}, HF)):
        out = subprocess.run([sys.executable, str(script), "--hf-token", "@@CLOUDTRAIN_SECRET_ARG_0@@"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(["--hf-token", expected])


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_cloud_requests_carry_secret_arguments_in_the_environment_only(
        provider: str, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is sent holds each secret argument as an environment value only (which the plan masks), never in a
    command or argument list (the platforms show those in their consoles, and nodes in ps)."""
    from cloudtrain.cli.render import plan_text
    from cloudtrain.sdk import Job
    from tests.clouds import AWS_OFFLINE as AWS
    from tests.clouds import GCP_OFFLINE as GCP

    for key, value in {**AWS, **GCP}.items():
        monkeypatch.setenv(key, value)
    options = {"azure": {"subscription_id": "s", "resource_group": "rg", "workspace": "ws"}}
    job = Job(script="train_ddp.py", source_dir=str(project), nodes=2, args=["--hf-token", HF, "--password=pw-99x"],
              env={"DATABASE_URL": "postgres://u:db-pass-1@h/x"}, providers=options if provider == "azure" else {})
    with job.plan(provider) as plan:
        sent = json.dumps(plan.request)
        for n, secret in enumerate((HF, "pw-99x")):  # each occurrence is the value of its variable, once per pool
            assert sent.count(secret) == sent.count(f'"CLOUDTRAIN_SECRET_ARG_{n}"') >= 1, sent
            assert f"@@CLOUDTRAIN_SECRET_ARG_{n}@@" in sent
        shown = plan_text(plan) + json.dumps(plan.to_dict())
        assert not any(secret in shown for secret in (HF, "pw-99x", "db-pass-1"))


def test_spec_errors_do_not_echo_secret_values(cli, tmp_path: Path) -> None:
    """An unquoted numeric password is not a string: the error names the field, not the value."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "cloudtrain.yaml").write_text("script: train.py\nenv:\n  DB_PASSWORD: 982734987\n  EPOCHS: 3\n")
    out = cli("plan", "-f", "cloudtrain.yaml", cwd=tmp_path)
    assert out.returncode == 2 and "env.DB_PASSWORD" in out.stderr and "982734987" not in out.stderr
    assert "(got 3)" in out.stderr  # an ordinary value is still shown


def test_an_env_flag_without_a_name_is_not_echoed(cli, tmp_path: Path) -> None:
    """`--env $HF_TOKEN` (the name forgotten) must not print the token in the error."""
    (tmp_path / "train.py").write_text("print(1)\n")
    out = cli("plan", "train.py", "--env", HF, cwd=tmp_path)
    assert out.returncode == 2 and "--env" in out.stderr and HF not in out.stderr


# Issue 28.5: a URL with credentials in an --env value, in every form people write one, masked in every plan
URL_SECRETS = {
    "DATABASE_URL": ("postgres://app:db-pw-7f3k2q9x@db:5432/x", "db-pw-7f3k2q9x"),
    "REDIS_URL": ("redis://:redis-pw-93kd72hs@cache:6379/0", "redis-pw-93kd72hs"),
    "REPO_URL": ("https://ghp0token0as0the0user0x83kd92@git.example.com/org/repo.git", "ghp0token0as0the0user0x83kd92"),
    "WEBHOOK": ("https://hooks.example.com/notify?channel=ml&token=hook-tok-83jd72kd", "hook-tok-83jd72kd"),
    "WEIGHTS_URL": ("https://b.s3.amazonaws.com/w.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=5f3a9c0d2e1b7a4c",
                    "5f3a9c0d2e1b7a4c"),
    # issue 38.13: a password holding what a URL's password "may not": `/` and `+` (an AWS-style secret key), `@`,
    # `:`, %-escapes; a user holding `@` (Azure's user@server); an IPv6 host; a socket instead of a host
    "ANALYTICS_URL": ("postgres://app:wJalrXUt/nFEMI/K7MDENG+bPxRfiCY@db:5432/x", "wJalrXUt/nFEMI/K7MDENG+bPxRfiCY"),
    "MYSQL_URL": ("mysql://root:p@ss:w0rd-x9@mysql.internal:3306/app", "p@ss:w0rd-x9"),
    "PG_SOCKET_URL": ("postgresql://me%40corp:pa%2Fss%40w0rd%3A9@/db?host=/run/pg", "pa%2Fss%40w0rd%3A9"),
    "AZURE_PG_URL": ("postgres://admin@srv:Azure/Pw+9x@srv.postgres.database.azure.com:5432/db", "Azure/Pw+9x"),
    "BROKER_URL": ("amqps://guest:q/u:e-7@[::1]:5671/vhost", "q/u:e-7"),
}


@pytest.mark.parametrize("name", sorted(URL_SECRETS))
def test_url_credentials_are_masked_whatever_they_hold_in_args_env_and_logs(name: str) -> None:
    """Issue 38.13: the password of a URL was masked only while it held no `/` or `@`: an AWS-style secret key in a
    DATABASE_URL was shown in clear in plans, job records and logs. The rest of the URL stays readable."""
    from cloudtrain.node.log_masking import Masker
    from cloudtrain.node.secret_values import env_secrets

    url, secret = URL_SECRETS[name]
    shown = redact({"env": {name: url}, "args": ["--source", url, f"--to={url}"]})
    assert secret not in json.dumps(shown) and MASK in shown["env"][name], shown
    assert shown["args"][1].split(MASK)[0] == url.split(secret)[0]  # up to the secret, as it was
    line = f"connecting to {url} (secret {secret})\n".encode()
    assert secret.encode() not in Masker(env_secrets({name: url}))(line)  # registered, and by shape
    assert secret.encode() not in Masker([])(line.split(b" (")[0])  # by shape alone: a URL in any log line
    assert split_args(["--source", url])[0] == ["--source", "@@CLOUDTRAIN_SECRET_ARG_0@@"]  # never on a command line


@pytest.mark.parametrize("text", ["https://host:8443/path/to/a@b.com", "git+https://github.com/org/repo@v1.0",
                                  "ssh://git@github.com:22/org/repo.git", "see http://localhost:6006/#scalars a@b.io",
                                  "https://user@host:8080/x"])
def test_urls_without_a_password_stay_readable(text: str) -> None:
    assert redact({"note": text}) == {"note": text}


def test_urls_with_credentials_are_masked_in_the_local_plan_as_in_the_clouds(cli, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The password of user:password@ was masked already; a token standing for the user part, and a token in the
    query string (a webhook, a presigned URL), were printed in clear by every plan, the local one included."""
    from tests.support import SETTINGS

    (tmp_path / "train.py").write_text("print(1)\n")
    flags = [arg for name, (url, _) in URL_SECRETS.items() for arg in ("--env", f"{name}={url}")]
    secrets = [secret for _, secret in URL_SECRETS.values()]
    shown = ""
    for command in (["plan"], ["plan", "-o", "json"], ["plan", "-o", "yaml"], ["submit", "--dry-run"]):
        out = cli(*command, "train.py", "--nodes", "2", *flags, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        shown += out.stdout + out.stderr
    assert "git.example.com/org/repo.git" in shown and "channel=ml" in shown  # the rest stays readable
    for provider in ("aws", "gcp"):
        out = cli("plan", "train.py", "-p", provider, *flags, "-o", "json", cwd=tmp_path, env_extra=SETTINGS)
        assert out.returncode == 0, out.stderr
        shown += out.stdout
    assert not [secret for secret in secrets if secret in shown]
