"""A job's outputs: the final model and anything else the job writes to its output URI, and each node's logs,
which the bootstrap copies there when the node ends (``logs/node-<rank>/``). The same on every provider: the
location is read from the job as the platform holds it, and fetched through cloudtrain's storage layer.

    python -m cloudtrain.outputs upload-logs DIR URI     # what the bootstrap runs at the end of a node
    python -m cloudtrain.outputs upload DIR URI          # a node's output folder (CLOUDTRAIN_OUTPUT_DIR), at its end
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import storage
from cloudtrain.errors import CloudtrainError, UserError
from cloudtrain.paths import is_within

if TYPE_CHECKING:
    from cloudtrain.handles import JobHandle


@dataclass(frozen=True)
class OutputFile:
    uri: str
    name: str  # relative to the output URI
    bytes: int | None = None  # known for files on disk (file:// or downloaded)
    path: Path | None = None  # where --download put it


def output_uri(provider: Any, handle: JobHandle) -> str:
    """The job's output location, as the platform holds the job (so it works from any machine)."""
    uri = provider.describe(handle).output_uri
    if not uri:
        raise UserError(f"{handle} has no output location cloudtrain can read",
                        remedy="set output_uri in the spec (s3://, gs://, az:// or file://) for jobs you submit; "
                               "jobs submitted by cloudtrain 0.1.0 before outputs existed have none")
    return str(uri)


def list_outputs(uri: str) -> list[OutputFile]:
    found = storage.with_retries(lambda: storage.store_for(uri).list(uri), f"listing {uri}")
    base = uri.rstrip("/") + "/"
    files = []
    for item in found:
        if item.endswith("/"):  # a folder marker (an S3 console's "Create folder"): nothing to download
            continue
        size = storage.local_path(item).stat().st_size if item.startswith("file://") else None
        files.append(OutputFile(item, item[len(base):] if item.startswith(base) else item.rsplit("/", 1)[-1], size))
    return files


def mark_download_folder(dest: Path, uri: str) -> bool:
    """Mark ``dest`` as downloaded outputs, which bundles leave out (a model and logs downloaded into the project
    must not ship with the next job). Only a new or empty folder (or one marked before) is marked: marking a folder
    that already held files, the source itself say, would leave those out too. Returns whether it is marked."""
    from cloudtrain.packaging import DOWNLOAD_MARKER

    marker = dest / DOWNLOAD_MARKER
    if dest.exists() and not marker.exists() and any(dest.iterdir()):
        print(f"note: {dest} already held files, so it is not marked as downloaded outputs: if it is inside a "
              "source folder, the next bundle includes what was downloaded (download into a new folder, or "
              "exclude it in .cloudtrainignore)", file=sys.stderr)
        return False
    dest.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"Outputs of {uri}, downloaded by `cloudtrain outputs --download`.\n"
                      "cloudtrain leaves this folder out of job bundles; delete this file to package it.\n")
    return True


def download(uri: str, dest: Path, show_progress: bool = True) -> list[OutputFile]:
    """Copy every output under ``uri`` into ``dest`` (folders kept), reporting progress per file. ``dest`` is
    marked so that bundles leave it out (:func:`mark_download_folder`)."""
    from cloudtrain.progress import Progress

    files = list_outputs(uri)
    mark_download_folder(dest, uri)
    fetched = []
    with Progress(f"downloading {uri}", total=len(files), unit="files", enabled=show_progress) as bar:
        for item in files:
            target = (dest / item.name).resolve()
            if not is_within(target, dest.resolve()):  # an object named '../x' must not write outside dest
                raise UserError(f"output {item.name!r} would land outside {dest}", remedy="download it by hand")
            target.parent.mkdir(parents=True, exist_ok=True)
            storage.with_retries(functools.partial(storage.store_for(item.uri).get_file, item.uri, target),
                                 f"download of {item.uri}")
            fetched.append(OutputFile(item.uri, item.name, target.stat().st_size, target))
            bar.advance(1)
    return fetched


def upload_tree(folder: Path, uri: str, name: Callable[[str], str] = str) -> int:
    """Copy every file under ``folder`` to ``uri`` under ``name(relative path)``; returns the number of files."""
    count = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        target = storage.join(uri, name(path.relative_to(folder).as_posix()))
        storage.with_retries(functools.partial(storage.put_file, path, target), f"upload of {target}")
        count += 1
    return count


def log_name(relative: str, runs: int) -> str:
    """torchrun's ``<run id>_<random>/attempt_N/<local rank>/stdout.log`` as ``attempt_N/local-rank-R/stdout.log``:
    the run folder says nothing to a reader when the node ran torchrun once (``runs``), so it goes."""
    parts = relative.split("/")
    if len(parts) == 4 and parts[1].startswith("attempt_") and parts[2].isdigit():
        parts[2] = f"local-rank-{parts[2]}"
        if runs == 1:
            parts = parts[1:]
    return "/".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] not in ("upload-logs", "upload"):
        print("usage: python -m cloudtrain.outputs upload-logs|upload DIR URI", file=sys.stderr)
        return 2
    if args[0] == "upload":
        return upload_outputs(Path(args[1]), args[2])
    folder, uri = Path(args[1]), args[2]
    if not folder.is_dir():
        count = 0
    else:
        runs = sum(1 for p in folder.iterdir() if p.is_dir())
        try:
            count = upload_tree(folder, uri, functools.partial(log_name, runs=runs))
        except CloudtrainError as exc:  # one line, no traceback: the bootstrap says where the logs still are
            print(f"[cloudtrain] error: {exc.message}", flush=True)
            return 1
    print(f"[cloudtrain] logs: {count} file(s) copied to {uri}", flush=True)
    return 0


def upload_outputs(folder: Path, uri: str) -> int:
    """What a plain script left in its output folder, copied to the job's output location (folders kept)."""
    count = upload_tree(folder, uri) if folder.is_dir() else 0
    print(f"[cloudtrain] outputs: {count} file(s) copied to {uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
