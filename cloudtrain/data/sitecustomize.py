"""Shipped as the bundle's ``lib/sitecustomize.py`` (lib/ leads PYTHONPATH on a node), so Python loads it in every
process torchrun starts: in a torchrun worker it puts the script's secret arguments back into ``sys.argv`` (they reach
the node as variables, so no command line shows them: ``cloudtrain/node/secret_values.py`` split_args), it installs
cloudtrain's exit guard (``cloudtrain/node/exit_guard.py`` says why) and the rank report (whether the worker joins a
process group: ``cloudtrain/node/rank_report.py``), then runs the sitecustomize that this one shadows (the image's), if
there is one."""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # what site.py does with a broken sitecustomize: say so, go on
        print(f"Error in sitecustomize ({spec.origin}): {exc!r}", file=sys.stderr)


def _restore_secret_args() -> None:
    # Only in a worker (torchrun sets TORCHELASTIC_RUN_ID for its workers, not for itself): torchrun must pass the
    # placeholders on, or the values would appear on every worker's command line.
    if "TORCHELASTIC_RUN_ID" not in os.environ or not any("@@CLOUDTRAIN_SECRET_ARG_" in a for a in sys.argv):
        return
    from cloudtrain.node.secret_values import restore_args

    sys.argv[:] = restore_args(sys.argv, os.environ)


try:
    _restore_secret_args()
except Exception as exc:  # the script then sees the placeholders, and says so in its own error
    print(f"[cloudtrain] secret arguments not restored: {exc!r}", file=sys.stderr)
try:
    from cloudtrain.node.exit_guard import install

    install()
except Exception as exc:  # never stop a worker from starting
    print(f"[cloudtrain] exit guard not installed: {exc!r}", file=sys.stderr)

# --- rank reports: does this worker join a process group? (cloudtrain/node/rank_report.py) ---------------------
try:
    from cloudtrain.node.rank_report import install as _report_rank

    _report_rank()
except Exception as exc:  # never stop a worker from starting
    print(f"[cloudtrain] rank report not installed: {exc!r}", file=sys.stderr)
# --- end of rank reports ---------------------------------------------------------------------------------

_run_shadowed()
