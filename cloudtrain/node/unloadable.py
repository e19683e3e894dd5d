"""A checkpoint a restart cannot load is never restored twice (issue 50): what a node concludes when its workers
failed after it restored a checkpoint and before the script made any progress. Standard library only, Python 3.8.

Whatever rule publishes checkpoints, one may slip through that a script cannot load (a subset of a save, a file the
script needs missing). Restoring it again would fail again, on every restart and every resubmission. So:

- **When.** The workers failed (torchrun exited non-zero; not a preemption, not a stop the node or its supervisor
  decided) after this start restored checkpoint N (the node's restore, or the Checkpointer's own load, which it notes
  in the checkpoint folder: store.LOADING_NOTE), and before any progress.
- **Progress** is what the script cannot fake by printing, or does not fake by accident: a checkpoint published since
  the restore that is not N's files again (a file N holds changed or gone: a script that rewrites a config file into
  its checkpoint folder at start-up republishes N's files, which is no progress), or a structured event the runtime
  prints from inside the training loop, in this run's worker logs: ``step`` (``report_step``), ``training_again``
  (the Checkpointer's first step after its load), ``checkpoint`` (its publish). A script's own "step 5" lines count
  for nothing. On several nodes the step events are global rank 0's, in node 0's logs: another node counts only
  checkpoints published.
- **Then** N is set aside in the store (set_aside.py: never restored, never deleted), with the first failed rank's
  exception as the reason, and the next start (a restart within max_restarts, or the next submission) restores the
  newest checkpoint before N, or starts from scratch.
- **Bounds: a failure that follows the script is not the checkpoint's.** A script that crashes at start-up whatever
  it loads would otherwise set aside every checkpoint, one per start. So N stays usable (a) when a newer checkpoint
  was set aside after the very same failure (the same exception line, but for the node's folder, the job's id and
  memory addresses: ``signature``), unless that line names a file in the checkpoint folder
  (``FileNotFoundError: ckpt/optim.pt`` is the checkpoint's, however often it repeats); the newer one's marker is
  then lifted too, so that once the script is fixed it resumes from the newest again; a start from scratch that
  fails the same way lifts them as well; and (b) when MAX_IN_A_ROW newer checkpoints are already set aside after
  failures: three unloadable checkpoints in a row are more likely one script's fault, and ``--restore-from`` picks
  an older one on purpose.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Callable

from cloudtrain import contract
from cloudtrain.node import diagnosis, events

MAX_IN_A_ROW = 3  # checkpoints set aside in a row after failures, at most, before the failure is taken for the script's
PROGRESS = ("step", "training_again", "checkpoint")  # events printed from inside the training loop


def _quiet(_line: str) -> None:
    pass


def _events(run: Path | None) -> bool:
    """Whether a worker of this run printed a progress event (any rank's stdout)."""
    marker = events.PREFIX.encode()
    for folder in diagnosis.rank_folders(run):
        try:
            with open(folder / "stdout.log", "rb") as f:
                for line in f:
                    if marker in line:
                        event = events.parse(line.decode("utf-8", "replace"))
                        if event and event.get("e") in PROGRESS:
                            return True
        except OSError:
            continue
    return False


def _files(checkpoint: Any) -> set[tuple[str, str]]:
    return {(str(f.get("path")), str(f.get("sha256"))) for f in checkpoint.manifest.get("files") or []
            if isinstance(f, dict)}


def _saved_since(survey: Any, checkpoint: Any, known: set[str] | None, since: float) -> bool:
    """Whether a checkpoint published since the restore holds something new: not every file of ``checkpoint`` again.
    ``known``: the digests the store held at the restore (else: published after ``since``)."""
    theirs = _files(checkpoint)
    for other in survey.complete:
        created = other.manifest.get("created")
        new = other.digest not in known if known is not None else (
            isinstance(created, (int, float)) and created > since)
        if new and other.digest != checkpoint.digest and not theirs <= _files(other):
            return True
    return False


def names_folder(failure: str, folder: Path, src: Path) -> bool:
    """Whether the failure names a file in the checkpoint folder (absolute, or as the script, in ``src``, wrote it)."""
    forms = {str(folder), str(folder.resolve())}
    with contextlib.suppress(ValueError):  # a folder outside the working folder: absolute only
        forms.add(folder.resolve().relative_to(src.resolve()).as_posix())
    return any(re.search(rf"(?<![\w.-]){re.escape(form)}/", failure) for form in forms if form not in (".", ""))


def signature(failure: str, env: dict[str, str], workdir: Path) -> str:
    """The failure without what differs between two starts of one script: the node's folder (a resubmission has
    another), the job's id, memory addresses."""
    for place in sorted({str(workdir.resolve()), str(workdir)}, key=len, reverse=True):
        failure = failure.replace(place, "<node>")
    if env.get(contract.JOB_ID):
        failure = failure.replace(env[contract.JOB_ID], "<job>")
    return re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", failure)


def _loaded(folder: Path, restored: dict[str, Any]) -> tuple[str | None, Any, Any, int | None]:
    """(store, the checkpoint the node restored or None, the digests its store held then or None, the step the
    Checkpointer noted it was loading or None): a Checkpointer that loaded another one than its node restored (an
    older one after a corrupt file, another store) is taken at its word."""
    from cloudtrain.checkpoint import store as checkpoint_store

    uri, report = restored.get("uri"), restored.get("report") or {}
    loaded, known = report.get("checkpoint"), report.get("known")
    noted = checkpoint_store.loading_noted(folder)
    if noted and (noted[0] != uri or loaded is None or noted[1] != loaded.step):
        return noted[0], None, None, noted[1]
    return uri, loaded, known, None


def judge(env: dict[str, str], src: Path, workdir: Path, restored: dict[str, Any], code: int,
          mask: Callable[[str], str] = str, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """After torchrun exited ``code`` (not 0, no preemption, no stop: the caller asks only then): set aside the
    checkpoint this start loaded if the workers failed before any progress, within the bounds above. ``restored``:
    the node's restore (steps.RESTORED: uri, report, at). Returns what the node's status records (set aside: step,
    uri, failure, next; or ``lifted``), or None."""
    from cloudtrain.checkpoint import set_aside
    from cloudtrain.checkpoint import store as checkpoint_store
    from cloudtrain.errors import CloudtrainError

    folder = Path(env.get(contract.CHECKPOINT_DIR) or workdir / "checkpoints")
    uri, loaded, known, noted = _loaded(folder, restored)
    if not uri:
        return None
    try:
        survey = checkpoint_store.survey(uri, log=_quiet)
        if noted is not None:  # as the store holds it now: set aside already, or found corrupt by the load: none
            loaded = next((c for c in survey.complete if c.step == noted), None)
        elif loaded is not None and loaded.digest not in {c.digest for c in survey.complete}:
            loaded = None  # saved again since (a new manifest), or set aside already: nothing to decide
        step = loaded.step if loaded is not None else None
        newer = [a for a in (set_aside.read(c) for c in survey.set_aside if step is None or c.step > step)
                 if a.kind == set_aside.FAILED]
        if loaded is None and not newer:
            return None  # nothing to set aside, and nothing to lift
        if loaded is not None and _saved_since(survey, loaded, known, float(restored.get("at") or 0)):
            return None
        run = diagnosis.newest_run(workdir / "worker-logs")
        if _events(run):  # read last: a long run's logs are the largest thing looked at
            return None
        first = diagnosis.first_failure(run)
        failure = mask(first[1] if first else f"the workers failed (torchrun exit {code}) without an exception in "
                                              "their logs")
        said = signature(failure, env, workdir)
        same = [a for a in newer if a.signature == said]
        if same and not names_folder(failure, folder, src):
            for aside in same:
                set_aside.lift(aside.checkpoint)
            which = ", ".join(str(a.step) for a in same)
            start = f"checkpoint {step}" if step is not None else "scratch"
            log(f"the start from {start} failed as the start from checkpoint {which} did ({failure}): the failure "
                f"follows the script, not a checkpoint; checkpoint {which} is usable again"
                + (f", and checkpoint {step} stays usable" if step is not None else ""))
            return {"lifted": [a.step for a in same], "failure": failure}
        if loaded is None:
            return None
        if len(newer) >= MAX_IN_A_ROW:
            log(f"checkpoint {step} stays usable although the start that restored it failed before any progress "
                f"({failure}): {len(newer)} newer checkpoints are set aside already after failures, so the failure is "
                "more likely the script's; fix it, or pick a checkpoint with submit --restore-from N "
                "(`cloudtrain checkpoints` lists them)")
            return None
        set_aside.set_aside(loaded, set_aside.FAILED,
                            f"a start that restored it failed before any progress: {failure}", said)
    except (CloudtrainError, OSError) as exc:
        log(f"warning: could not set aside the checkpoint this start restored ({exc}): the next start may restore it "
            "again")
        return None
    before = [c for c in survey.complete if c.step < loaded.step]
    then = f"the next start restores checkpoint {before[-1].step}" if before else \
        "the next start starts from scratch (no checkpoint before it)"
    line = (f"checkpoint {loaded.step} under {uri} is set aside: the start that restored it failed before any "
            f"progress ({failure}); {then}")
    log(line)
    return {"step": loaded.step, "uri": loaded.uri, "failure": failure,
            "next": before[-1].step if before else None, "line": line}
