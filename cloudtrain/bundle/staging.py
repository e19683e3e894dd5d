"""Where a job's bundle goes before any node starts, and how jobs are named: shared by every provider."""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from cloudtrain import storage
from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME, Package
from cloudtrain.spec.model import JobSpec

_SAVED_JOB_ID: ContextVar[str | None] = ContextVar("saved_job_id", default=None)


def new_job_id(name: str) -> str:
    """``<name>-<UTC date>-<time>-<4 hex>``: unique per submission, at most 61 characters for a 40-character
    spec name, and valid on every platform (lowercase letters, digits, '-'). Inside ``saved_job_id(id)``: that id."""
    return _SAVED_JOB_ID.get() or f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


@contextmanager
def saved_job_id(job_id: str) -> Iterator[None]:
    """Plan with the job id a saved plan recorded (``cloudtrain submit --plan``), so submitting it makes that job."""
    token = _SAVED_JOB_ID.set(job_id)
    try:
        yield
    finally:
        _SAVED_JOB_ID.reset(token)


def bundle_prefix(store: str, package: Package) -> str:
    """Content-addressed: the same source gives the same prefix, so re-submitting uploads nothing."""
    return storage.join(store, "bundles", package.digest.split(":", 1)[1])


def stage_bundle(package: Package, prefix: str, progress: bool = True) -> bool:
    """Upload bootstrap and bundle under a digest-named prefix; the manifest goes last and marks it complete.
    Returns False (uploading nothing) when that digest is already staged. ``progress``: a bar (or plain lines) on
    stderr while it uploads."""
    from cloudtrain.progress import Progress

    manifest_uri = storage.join(prefix, "manifest.json")
    if prefix.startswith("file://"):  # what a staging killed midway left in the store (its .part files)
        from cloudtrain.storage.local import sweep_abandoned_parts

        sweep_abandoned_parts(storage.local_path(prefix).parent)
    if storage.exists(manifest_uri):
        STAGED.update(bytes=0, seconds=0.0, at=time.time(), reused=True)
        return False
    total = package.bootstrap.stat().st_size + package.bundle_bytes
    started = time.monotonic()
    pieces = [storage.join(prefix, BOOTSTRAP_NAME), storage.join(prefix, BUNDLE_NAME)]
    try:
        with Progress(f"staging {prefix}", total=total, enabled=progress) as bar:
            storage.put_file(package.bootstrap, pieces[0], bar.advance)
            storage.put_file(package.path, pieces[1], bar.advance)
            storage.write_bytes(manifest_uri, json.dumps(package.manifest(), indent=1).encode())
    except OSError as exc:  # a file:// store that is full or read-only: no half bundle stays, one message
        if not prefix.startswith("file://"):
            raise
        from cloudtrain.home.errors import os_problem

        with contextlib.suppress(OSError):
            if not storage.exists(manifest_uri):  # else another submit staged it whole meanwhile
                storage.store_for(prefix).delete(pieces)
        raise os_problem(exc, storage.local_path(prefix), "stage the bundle",
                         elsewhere="point providers.local.store_uri (or CLOUDTRAIN_HOME) at a writable folder on a "
                                   "disk with room") from None
    STAGED.update(bytes=total, seconds=round(time.monotonic() - started, 3), at=time.time(), reused=False)
    return True


# The newest staging of this process (bytes, seconds, when it ended): `Provider.submit` puts it in the job's timeline.
STAGED: dict[str, Any] = {}


def lineage_id(spec: JobSpec) -> str:
    """Which job a checkpoint belongs to: the spec's name, its entry point and its project folder's name, hashed.
    The same job submitted again (other arguments, another machine) has the same lineage and resumes; another
    project's job that happens to share a name or a script name does not."""
    project = Path(spec.source_dir).expanduser().resolve().name
    entry = spec.script or spec.module or ""
    digest = hashlib.sha256("\0".join([str(spec.name), entry, project]).encode()).hexdigest()[:10]
    return f"{spec.name}-{digest}"


def cloud_locations(spec: JobSpec, home: str, provider: str, job_id: str) -> tuple[JobSpec, str, list[str]]:
    """For a cloud whose staging lives under ``home`` (``s3://bucket/cloudtrain``): the spec with a checkpoint URI
    for spot jobs that have none (an interrupted job must have somewhere to resume from; named by the job's lineage,
    so only this job resumes from it) and with its output URI (default: ``home/outputs/<job id>``, so no run
    overwrites another's), the location the platform itself writes to (the output URI when it is on this cloud's
    storage), and notes saying what was chosen and why. A ``file://`` location is on this computer, which no cloud
    node can reach: it is replaced by the cloud's default, loudly."""
    notes = []
    spec = spec.model_copy(deep=True)
    lineage = lineage_id(spec)
    default_checkpoints = f"{home}/checkpoints/{lineage}"
    if spec.checkpoint.uri and spec.checkpoint.uri.startswith("file://"):
        notes.append(f"{provider}: CHECKPOINT MOVED: checkpoint.uri {spec.checkpoint.uri} is on this computer, which "
                     f"the nodes cannot reach: they use {default_checkpoints} (set checkpoint.uri to a location on "
                     "this cloud's storage to choose)")
        spec.checkpoint.uri = default_checkpoints
    elif spec.spot and not spec.checkpoint.uri:
        spec.checkpoint.uri = default_checkpoints
        notes.append(f"{provider}: spot without checkpoint.uri: checkpoints go to {spec.checkpoint.uri}, so an "
                     "interrupted job resumes instead of starting over")
    if spec.checkpoint.uri:
        notes.append(f"{provider}: resumes from the newest checkpoint under {spec.checkpoint.uri} written by this "
                     f"job's lineage {lineage} (name, entry point and project folder): a resubmission resumes, "
                     "another job's checkpoints there stop the nodes before they train")
    if spec.output_uri and spec.output_uri.startswith("file://"):
        notes.append(f"{provider}: OUTPUT MOVED: output_uri {spec.output_uri} is on this computer: outputs go to "
                     f"{default_output_uri(home, job_id)}")
        spec.output_uri = None
    if not spec.output_uri:
        spec.output_uri = default_output_uri(home, job_id)
    scheme = home.split("://", 1)[0] + "://"
    output = spec.output_uri if spec.output_uri.startswith(scheme) else default_output_uri(home, job_id)
    return spec, output, notes


def default_output_uri(home: str, job_id: str) -> str:
    """Where a job's outputs (final model, node logs) go when its spec names no output_uri."""
    return f"{home}/outputs/{job_id}"
