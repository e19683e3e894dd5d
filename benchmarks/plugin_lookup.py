"""What a provider lookup costs: a built-in's (the baseline, measured in the same run), a plugin's, and a plugin's
when every lookup rescans the installed distributions' entry points, as each one did before lookups were cached.

    python benchmarks/plugin_lookup.py [--repeat 2000]

The plugin is tests/plugin/toyprov, installed as pip installs a distribution (a .dist-info with its entry point) in
a temporary folder put on sys.path in front of this interpreter's own site-packages (which are scanned too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def per_call_ms(call: Callable[[], object], repeat: int) -> float:
    """The median over 5 rounds of the mean time of one call, in milliseconds."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            call()
        rounds.append((time.perf_counter() - start) / repeat * 1000)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    site = Path(tempfile.mkdtemp(prefix="ct-bench-site-"))
    dist = site / "toyprov-0.1.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[cloudtrain.providers]\ntoy = toyprov:PROVIDER\n")
    sys.path[:0] = [str(site), str(REPO / "tests" / "plugin"), str(REPO)]
    from cloudtrain import registry

    def rescanned() -> object:
        registry._scanned = None  # what every lookup paid before the cache: a scan of every sys.path folder
        return registry.declaration("toy")

    cases: dict[str, Callable[[], object]] = {
        "declaration('aws') (built-in, baseline)": lambda: registry.declaration("aws"),
        "declaration('toy') (plugin, cached)": lambda: registry.declaration("toy"),
        "names() (built-ins + plugins, cached)": registry.names,
        "declaration('toy') rescanning (before)": rescanned,
    }
    registry.declaration("toy")  # imported once, as any first lookup does
    print(f"{len(sys.path)} sys.path entries, {args.repeat} calls per round")
    baseline = None
    for label, call in cases.items():
        ms = per_call_ms(call, args.repeat if "before" not in label else max(1, args.repeat // 50))
        baseline = baseline or ms
        print(f"{label:45s} {ms:9.4f} ms  {ms / baseline:8.1f}x the built-in")


if __name__ == "__main__":
    main()
