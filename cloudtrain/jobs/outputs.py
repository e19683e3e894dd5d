"""A job's outputs, listed and downloaded (`cloudtrain outputs`, ``Run.outputs``): the final model and anything else
the job writes to its output URI, and each node's logs, which the node copies there when it ends
(``logs/node-<rank>/``, cloudtrain/node/output_upload.py). The same on every provider: the location is read from the
job as the platform holds it, and fetched through cloudtrain's storage layer.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import storage
from cloudtrain.errors import UserError
from cloudtrain.storage.paths import is_within

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
    from cloudtrain.bundle.packaging import DOWNLOAD_MARKER

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
