"""The shape of cloudtrain's imports, counted the way issue 39 counts it, for the working tree or any git revision:

    python benchmarks/import_graph.py                 # the working tree
    python benchmarks/import_graph.py 9f41c58 HEAD    # before and after, side by side

A *unit* is a module at the top of ``cloudtrain/`` or a folder there (a room: spec/, plan/, providers/ ...). Counted
over the units, with the imports made only for type checking included: modules flat at the top, arrows (one unit
importing another), circles (groups of units that import each other round, and how many units they hold), and
floors (the longest chain of units, each importing the next, once each circle is taken as one). grimp (what
import-linter runs on) reads the imports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tree_of(revision: str | None, into: Path) -> Path:
    """cloudtrain/ of ``revision`` unpacked under ``into`` (the working tree itself for None)."""
    if revision is None:
        return REPO
    archive = subprocess.run(["git", "archive", revision, "cloudtrain"], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def counts(root: Path) -> dict[str, int]:
    sys.path.insert(0, str(root))
    try:
        import grimp

        graph = grimp.build_graph("cloudtrain", exclude_type_checking_imports=False, cache_dir=None)
    finally:
        sys.path.remove(str(root))
    unit = {m: ".".join(m.split(".")[:2]) for m in graph.modules if m != "cloudtrain"}
    arrows = {(unit[a], unit[b]) for a in unit for b in graph.find_modules_directly_imported_by(a)
              if b in unit and unit[a] != unit[b]}
    units = sorted(set(unit.values()))
    circles = _strongly_connected(units, arrows)
    flat = [p for p in (root / "cloudtrain").glob("*.py") if p.name != "__init__.py"]
    return {"modules flat at the top": len(flat), "units (top modules and rooms)": len(units),
            "arrows between units": len(arrows), "circles": sum(1 for c in circles if len(c) > 1),
            "units in circles": sum(len(c) for c in circles if len(c) > 1),
            "floors": _floors(circles, arrows)}


def _strongly_connected(nodes: list[str], arrows: set[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (the graph is small, but recursion limits are not worth thinking about)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in arrows:
        out[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(out[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    found.append(group)
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(out[step])))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return found


def _floors(circles: list[list[str]], arrows: set[tuple[str, str]]) -> int:
    """The longest chain of the graph with each circle taken as one unit."""
    group = {member: i for i, circle in enumerate(circles) for member in circle}
    below: dict[int, set[int]] = {i: set() for i in range(len(circles))}
    for a, b in arrows:
        if group[a] != group[b]:
            below[group[a]].add(group[b])
    depth: dict[int, int] = {}
    for i in range(len(circles)):  # Tarjan finds a group after every group it reaches
        depth[i] = 1 + max((depth[j] for j in below[i]), default=0)
    return max(depth.values(), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="*", help="git revisions (default: the working tree)")
    revisions = parser.parse_args().revisions or [None]
    table = {}
    for revision in revisions:
        with tempfile.TemporaryDirectory(prefix="import-graph-") as tmp:
            # each tree in its own process: grimp and the import system cache what they have seen
            code = (f"import json, pathlib, sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); "
                    f"import import_graph as g; "
                    f"print(json.dumps(g.counts(g.tree_of({revision!r}, pathlib.Path({tmp!r})))))")
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            table[revision or "working tree"] = json.loads(done.stdout)
    names = list(next(iter(table.values())))
    width = max(len(n) for n in names)
    print(" " * width + "".join(f"{r[:12]:>14}" for r in table))
    for name in names:
        print(f"{name:<{width}}" + "".join(f"{table[r][name]:>14}" for r in table))


if __name__ == "__main__":
    main()
