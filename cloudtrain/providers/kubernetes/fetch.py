"""The first step of every node's container: put bootstrap.py and bundle.tar.gz in a local folder, then become the
bootstrap (exec). Run as ``python3 -c <this file's source> SOURCE DEST -- python3 DEST/bootstrap.py ...``: the
bundle is not on the node yet, so this cannot ship in it. Standard library only, Python 3.8 (object stores through
what the image has: fsspec, else boto3, google-cloud-storage or azure-storage-blob, with the pod's cloud identity).

A TrainJob cannot add an init container (its runtimePatches patch only the runtime's own containers: name, env,
volumeMounts, securityContext), so the fetch is the node container's own first step, for both job kinds.

SOURCE: ``parts:FOLDER`` (the ConfigMaps of a pvc:// staging, mounted: bootstrap.py and bundle.part-NNN, joined in
order) or an object-store prefix (s3://, gs://, az://) holding bootstrap.py and bundle.tar.gz. The bundle must
match the bootstrap's ``--digest`` before it takes its place in DEST: one altered in the store or cut short is refused
here, and never kept for the container's next start.
"""

import hashlib
import os
import shutil
import sys

NAMES = ("bootstrap.py", "bundle.tar.gz")


def _from_parts(folder, dest):
    shutil.copyfile(os.path.join(folder, "bootstrap.py"), os.path.join(dest, "bootstrap.py"))
    parts = sorted(n for n in os.listdir(folder) if n.startswith("bundle.part-"))
    if not parts:
        raise SystemExit(f"cloudtrain fetch: no bundle parts in {folder} (the job's ConfigMaps are not mounted)")
    with open(os.path.join(dest, "bundle.tar.gz"), "wb") as out:
        for name in parts:
            with open(os.path.join(folder, name), "rb") as part:
                shutil.copyfileobj(part, out)


def _download(uri, path):
    try:
        import fsspec
        with fsspec.open(uri, "rb") as src, open(path, "wb") as out:
            shutil.copyfileobj(src, out)
        return
    except ImportError:
        pass
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme == "s3":
        import boto3
        boto3.client("s3").download_file(bucket, key, path)
    elif scheme == "gs":
        from google.cloud import storage
        storage.Client().bucket(bucket).blob(key).download_to_filename(path)
    elif scheme == "az":
        from azure.identity import DefaultAzureCredential
        from azure.storage.blob import BlobClient
        account = os.environ["AZURE_STORAGE_ACCOUNT"]
        blob = BlobClient(f"https://{account}.blob.core.windows.net", bucket, key,
                          credential=DefaultAzureCredential())
        with open(path, "wb") as out:
            blob.download_blob().readinto(out)
    else:
        raise SystemExit(f"cloudtrain fetch: cannot read {uri}")


def _expected(command):
    """The bootstrap's --digest (its own options end at the first "--"; the script's arguments follow)."""
    options = command[:command.index("--")] if "--" in command else command
    for i, arg in enumerate(options):
        if arg == "--digest" and i + 1 < len(options):
            return options[i + 1]
        if arg.startswith("--digest="):
            return arg[len("--digest="):]
    return None


def _check(path, expected, source):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    found = "sha256:" + digest.hexdigest()
    if expected and found != expected:
        os.remove(path)
        where = ("the job's ConfigMaps (cloudtrain-bundle-*, immutable: delete them)" if source.startswith("parts:")
                 else f"{source} (delete that prefix)")
        raise SystemExit(f"cloudtrain fetch: the bundle from {source} does not match its digest {expected} (it is "
                         f"{found}): altered or truncated; the job cannot start from it. Remove {where} and submit "
                         "the job again")


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: fetch SOURCE DEST -- COMMAND...")
    source, dest, command = argv[0], argv[1], argv[3:]
    if not os.path.isdir(dest):
        os.makedirs(dest)
    if not os.path.isfile(os.path.join(dest, NAMES[1])):  # a container restarted in place: fetched already
        try:
            part = os.path.join(dest, "fetching")  # renamed when whole: a restart never sees half a bundle
            if not os.path.isdir(part):
                os.makedirs(part)
            if source.startswith("parts:"):
                _from_parts(source[len("parts:"):], part)
            else:
                for name in NAMES:
                    _download(source.rstrip("/") + "/" + name, os.path.join(part, name))
            _check(os.path.join(part, NAMES[1]), _expected(command), source)
            for name in NAMES:
                os.rename(os.path.join(part, name), os.path.join(dest, name))
        except ImportError as exc:
            raise SystemExit(f"cloudtrain fetch: the image cannot read {source} ({exc}): install fsspec with s3fs, "
                             "gcsfs or adlfs (or boto3, google-cloud-storage, azure-storage-blob) in it") from None
    sys.stdout.write(f"cloudtrain fetch: {source} -> {dest}\n")
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
