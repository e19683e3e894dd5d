"""What the packaging guard refuses or leaves out: credentials by name (any case), by content (well-known formats,
with the file, line and the way to allow it), through links, cloudtrain's own spec files and downloaded outputs.

Credential-shaped test values are assembled at run time, so this file itself holds none."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from cloudtrain.bundle.packaging import DOWNLOAD_MARKER, PackageLimits, build_package
from cloudtrain.errors import PackagingError
from tests.support import ALNUM, HEX, aws_key_id, make_tree, rand


def pem_block(indent: str = "") -> str:
    lines = ["-----BEGIN " + "RSA PRIVATE KEY-----", *(rand(64, ALNUM + "+/", seed=i) for i in range(3)),
             "-----END RSA PRIVATE KEY-----"]
    return "".join(f"{indent}{line}\n" for line in lines)


# (file name, content, the line the credential is on, rule): one per rule the scan names, each in the kind of file
# it turns up in.
CONTENT_CASES = [
    ("config.py", f'AWS_ACCESS_KEY_ID = "{aws_key_id()}"\n', 1, "aws-access-key-id"),
    ("settings.ini", f"[aws]\naws_secret_access_key = {rand(40, ALNUM + '/+')}\n", 2, "aws-secret-access-key"),
    ("download.py", f'token = "{"h" + "f_" + rand(34)}"\n', 1, "huggingface-token"),
    ("ci.py", f'GH = "{"gh" + "p_" + rand(36)}"\n', 1, "github-token"),
    ("llm.py", f'client = OpenAI(api_key="{"sk" + "-proj-" + rand(48)}")\n', 1, "openai-anthropic-key"),
    ("deploy/notes.txt", "the key:\n" + pem_block(), 2, "private-key"),
    ("gcp.json", '{\n  "type": "service' + '_account",\n  "project_id": "p"\n}\n', 2, "gcp-service-account-key"),
    ("storage.py", 'CONN = "DefaultEndpointsProtocol=https;AccountName=a;Account'
     + f'Key={rand(86, ALNUM + "+/")}==;"\n', 1, "azure-connection-string"),
    # issue 28.3: the credential files ML people keep, under any name, found by what they hold
    ("old/my-gcloud-creds.json", '{\n  "client_id": "764086051850-x.apps.googleusercontent.com",\n  "refresh_token": '
     f'"1//0g{rand(90, ALNUM + "_-")}",\n  "type": "authorized_user"\n}}\n', 3, "oauth-refresh-token"),
    ("adc.json", '{"account": "", "client_id": "7.apps.googleusercontent.com", "type": "authorized' + '_user"}\n',
     1, "gcloud-user-credentials"),
    ("data/kaggle_token.json", '{"username":"ana","key":"' + rand(32, HEX) + '"}', 1, "kaggle-api-key"),
    ("dot_netrc", f"machine api.wandb.ai\n  login user\n  password {rand(40, HEX)}\n", 3, "netrc-password"),
    ("auth.txt", f"machine urs.earthdata.nasa.gov login ana password {rand(14)}\n", 1, "netrc-password"),
    ("release/pypirc.ini", f"[pypi]\nusername = ana\npassword = {rand(18)}\n", 3, "ini-password"),
    ("upload.cfg", f"[pypi]\nusername = __token__\npassword = pypi-Ag{'E'}{rand(80, ALNUM + '_-')}\n", 3,
     "ini-password"),
    ("web/npmrc.txt", f"//registry.npmjs.org/:_authToken=npm_{rand(36)}\n", 1, "npm-token"),
    ("docker.json", '{"auths": {"https://index.docker.io/v1/": {"au' + f'th": "{rand(28)}="}}}}}}\n', 1,
     "docker-auth"),
    ("azure_cache.json", '{"RefreshToken": {"k": {"credential_type": "Refresh' + 'Token", "secret": "x"}}}\n', 1,
     "oauth-refresh-token"),
    ("cluster.yaml", f"users:\n- name: u\n  user:\n    client-key-data: {rand(120, ALNUM + '+/')}==\n", 4,
     "kubeconfig-key"),
    ("wandb_setup.py", 'os.environ["WANDB_API' + f'_KEY"] = "{rand(40, HEX)}"\n', 1, "secret-assignment"),
    ("notebook.py", f'import wandb\nwandb.login(key="{rand(40, HEX)}")\n', 2, "wandb-api-key"),
    ("prod.settings", f"DEBUG=0\nOPENAI_API_KEY={rand(48)}\n", 2, "secret-assignment"),
    ("client_secret_1234.json", '{"installed": {"client_id": "1.apps.googleusercontent.com", "client_' + 'secret": '
     f'"GOCSPX-{rand(28)}"}}}}\n', 1, "oauth-client-secret"),
    ("git-creds.txt", f"https://ana:{rand(40)}@github.com\n", 1, "git-credentials"),
    ("databricks.cfg", f"[DEFAULT]\nhost = https://x.cloud.databricks.com\ntoken = dap{'i'}{rand(32, HEX)}\n", 3,
     "token-formats"),
    ("hf/token", "h" + "f_" + rand(34), 1, "huggingface-token"),
]
CASE_IDS = [case[3] for case in CONTENT_CASES]


def refused(root: Path) -> PackagingError:
    with pytest.raises(PackagingError) as info:
        build_package(root)
    assert info.value.exit_code == 2
    return info.value


@pytest.mark.parametrize("name", ["prod.env", ".ENV", "Prod.Env", "credentials.csv", "deploy_key",
                                  ".docker/config.json", "gcp-key.json", "ID_RSA", "jane_accessKeys.csv",
                                  "kaggle.json", ".kaggle/kaggle.json", ".databrickscfg", ".s3cfg", ".boto"])
def test_credential_files_are_refused_by_name_in_any_case(tmp_path: Path, name: str) -> None:
    root = make_tree(tmp_path / "src")
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text("anything\n")
    error = refused(root)
    assert "usually hold credentials" in str(error) and name.split("/")[0] in str(error)


@pytest.mark.parametrize("name", ["keyboard.py", "monkey.json", "tokenizer.json", "environment.yml", "env.py",
                                  "prod.env.example", "credentials_test.py", "keys.py"])
def test_ordinary_names_are_packaged(tmp_path: Path, name: str) -> None:
    root = make_tree(tmp_path / "src")
    (root / name).write_text("x = 1\n")
    with build_package(root) as package:
        assert name in [f["path"] for f in package.files]


@pytest.mark.parametrize(("name", "content", "line", "rule"), CONTENT_CASES, ids=CASE_IDS)
def test_credentials_in_contents_are_refused_with_file_line_and_remedy(tmp_path: Path, name: str, content: str,
                                                                       line: int, rule: str) -> None:
    root = make_tree(tmp_path / "src")
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text("# a file\n" + content)
    error = refused(root)
    assert f"{name}:{line + 1} ({rule})" in str(error), str(error)
    remedy = str(error.remedy)
    assert "cloudtrain: allow-secret" in remedy and "--allow-secret" in remedy and "allow_secrets" in remedy
    secret_parts = [w for w in content.replace('"', " ").replace("=", " ").split() if len(w) >= 16]
    assert not any(part in f"{error} {remedy}" for part in secret_parts)  # the message never shows the value


@pytest.mark.parametrize(("name", "content", "line", "rule"), CONTENT_CASES, ids=CASE_IDS)
def test_a_credential_is_allowed_by_its_line_or_by_the_file(tmp_path: Path, name: str, content: str, line: int,
                                                            rule: str) -> None:
    root = make_tree(tmp_path / "src")
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(content)
    with build_package(root, PackageLimits(allow_secrets=(name.rsplit("/", 1)[-1],))) as package:
        assert name in [f["path"] for f in package.files]
    marked = "".join(f"{line}  # cloudtrain: allow-secret\n" for line in content.splitlines())
    (root / name).write_text(marked)
    with build_package(root) as package:
        assert name in [f["path"] for f in package.files]


def test_ordinary_code_is_not_mistaken_for_credentials(tmp_path: Path) -> None:
    """What real training code holds: the word password in a help text, secrets read from the environment, URL
    templates, a key header the code looks for, library names that start like tokens, and published examples."""
    root = make_tree(tmp_path / "src")
    (root / "train.py").write_text(
        'import argparse, os\n'
        'p = argparse.ArgumentParser()\n'
        'p.add_argument("--password", help="the database password (or set DB_PASSWORD)")\n'
        'p.add_argument("--hf-token", default=os.environ.get("HF_TOKEN"))\n'
        'url = f"postgresql://{user}:{password}@{host}/db"\n'
        'HEADER = "-----BEGIN ' + 'PRIVATE KEY-----"\n'
        'from huggingface_hub import hf_hub_download  # hf_hub_download_with_a_very_long_name_here\n'
        'import sklearn  # sk-learn, not sk-anything-that-is-long-enough\n'
        'conn = f"DefaultEndpointsProtocol=https;AccountName={name};Account' + 'Key={key}"\n'
        'AWS_DOCS_KEY = "AKIA' + 'IOSFODNN7EXAMPLE"\n'
        'AZURITE = "Account' + 'Key=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/'
        'KBHBeksoGMGw=="\n'
        'weights = "high_weight_through_the_night_gh_pages"\n'
        'password = os.environ["DB_PASSWORD"]\n'
        'login(username=user, password=password)\n'
        'cache = {"refresh_token": None, "auth": None}\n')
    (root / "README.md").write_text(  # netrc and .pypirc as documented, with placeholders
        "A machine learning project: no password needed.\n"
        "machine api.wandb.ai login user password <your-api-key>\n"
        "[pypi]\nusername = __token__\npassword = ${PYPI_TOKEN}\n")
    (root / ".npmrc.example").write_text("//registry.npmjs.org/:_authToken=${NPM_TOKEN}\n")
    with build_package(root) as package:
        assert {"train.py", "README.md", ".npmrc.example"} <= {f["path"] for f in package.files}


def test_binary_files_are_not_scanned_and_a_key_split_across_reads_is_found(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "weights.bin").write_bytes(b"\0" * 10 + aws_key_id().encode())  # binary: as git decides, not scanned
    with build_package(root) as package:
        assert "weights.bin" in [f["path"] for f in package.files]
    # tarfile reads a file 16 KiB at a time: a key across that boundary is still found, on its own line number
    filler = "".join(f"x{i} = {i}\n" for i in range(4000))
    cut = 16 * 1024 - len(filler.encode()) % (16 * 1024)
    body = filler + "y" * (cut - 10) + "\n" + f'K = "{aws_key_id()}"\n'
    (root / "big.py").write_text(body)
    assert "big.py:4002 (aws-access-key-id)" in str(refused(root))


def test_credentials_reached_through_links_are_refused(tmp_path: Path) -> None:
    """A link ships its target's content, so it is judged by its target: a git-ignored .env, git's own config, an
    ignored data file, a folder, a loop."""
    root = make_tree(tmp_path / "src")
    (root / ".gitignore").write_text(".env\ndata/\n")
    (root / ".env").write_text("DB_PASSWORD=hunter2\n")
    (root / "settings.cfg").symlink_to(".env")
    assert "settings.cfg is a link to .env" in str(refused(root))
    (root / "settings.cfg").unlink()

    (root / ".git" / "config").write_text("[remote]\nurl = https://user:token@example.com/x.git\n")
    (root / "gitcfg.txt").symlink_to(root / ".git" / "config")
    assert "gitcfg.txt is a link to .git/config" in str(refused(root))
    (root / "gitcfg.txt").unlink()

    (root / "data").mkdir()
    (root / "data" / "rows.csv").write_text("a,b\n")
    (root / "rows.csv").symlink_to("data/rows.csv")
    assert "ignored" in str(refused(root))
    (root / "rows.csv").unlink()

    (root / "pkg_link").symlink_to("pkg")
    assert "a folder" in str(refused(root))
    (root / "pkg_link").unlink()

    (root / "loop_a").symlink_to("loop_b")
    (root / "loop_b").symlink_to("loop_a")
    assert "cannot be followed" in str(refused(root))
    (root / "loop_a").unlink()
    (root / "loop_b").unlink()

    (root / "model_link.py").symlink_to("pkg/model.py")  # a link to a file that ships anyway still ships
    with build_package(root) as package, tarfile.open(package.path) as tar:
        member = tar.extractfile("src/model_link.py")
        assert member is not None and member.read() == b"X = 1\n"


def test_spec_files_are_left_out_and_said_so(tmp_path: Path) -> None:
    """cloudtrain.yaml (or any spec given with -f) is never shipped: nodes get its settings through the request,
    and a copy would carry env values in clear. Other YAML stays."""
    root = make_tree(tmp_path / "src")
    (root / "cloudtrain.yaml").write_text("env:\n  DB_PASSWORD: hunter2\n")  # the name alone says it
    (root / "jobs").mkdir()
    (root / "jobs" / "big.yml").write_text("nodes: 4\nmodule: pkg.train\n")
    (root / "jobs" / "gpu.yaml").write_text("script: train.py\nenv:\n  DB_PASSWORD: hunter2\n")
    (root / "config.yaml").write_text("lr: 0.1\nscript: not-a-spec\n")
    with build_package(root) as package, tarfile.open(package.path) as tar:
        names = tar.getnames()
        assert "src/config.yaml" in names
        assert not {"src/cloudtrain.yaml", "src/jobs/big.yml", "src/jobs/gpu.yaml"} & set(names)
        assert package.left_out == ["cloudtrain.yaml", "jobs/big.yml", "jobs/gpu.yaml"]
        assert package.manifest()["left_out"] == package.left_out
        assert [note.split(" (")[0] for note in package.notes()] == [  # cloudtrain.yaml goes without saying
            "package: left out 2 files: jobs/big.yml, jobs/gpu.yaml"]


def test_downloaded_outputs_are_left_out(tmp_path: Path) -> None:
    """`cloudtrain outputs --download out/` inside the project: the model and logs do not ship with the next job.
    A folder that already held files is not marked (it may be the source itself), and says so."""
    from cloudtrain.jobs.outputs import download

    store = tmp_path / "store" / "job-1"
    (store / "logs" / "node-0").mkdir(parents=True)
    (store / "model.pt").write_bytes(b"weights")
    (store / "logs" / "node-0" / "stdout.log").write_text("trained\n")
    root = make_tree(tmp_path / "src")
    fetched = download(store.as_uri(), root / "out", show_progress=False)
    assert {f.name for f in fetched} == {"model.pt", "logs/node-0/stdout.log"}
    assert (root / "out" / DOWNLOAD_MARKER).is_file()
    with build_package(root) as package:
        assert not any(f["path"].startswith("out/") for f in package.files)
        assert package.left_out == ["out/"]
        assert any("left out out/" in note and DOWNLOAD_MARKER in note for note in package.notes())
    download(store.as_uri(), root / "out", show_progress=False)  # again: still marked, still left out
    (root / "out" / DOWNLOAD_MARKER).unlink()  # the user wants it shipped after all
    with build_package(root) as package:
        assert "out/model.pt" in [f["path"] for f in package.files]

    download(store.as_uri(), root / "pkg", show_progress=False)  # a folder of code: not marked
    assert not (root / "pkg" / DOWNLOAD_MARKER).exists()


def test_every_content_rule_is_reached_by_a_probe() -> None:
    from cloudtrain.bundle.secret_scan import FILE_RULES, PROBES

    assert {name for _, names in PROBES for name in names} == {rule.name for rule in FILE_RULES}


def test_the_plan_says_what_was_left_out(cli, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "proj")
    (root / "gpu.yaml").write_text("script: train.py\nnodes: 1\nenv:\n  DB_PASSWORD: hunter2-x\n")
    (root / "out").mkdir()
    (root / "out" / DOWNLOAD_MARKER).write_text("downloaded\n")
    (root / "out" / "model.pt").write_bytes(b"weights")
    out = cli("plan", "-f", "gpu.yaml", cwd=root)
    assert out.returncode == 0, out.stderr
    assert "package: left out 1 file and 1 folder: gpu.yaml (a cloudtrain spec file" in out.stdout
    assert f"; out/ (downloaded outputs; delete out/{DOWNLOAD_MARKER} to package it)" in out.stdout
    assert "hunter2-x" not in out.stdout
