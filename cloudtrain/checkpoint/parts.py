"""A multi-node job's checkpoint files that are written on nodes other than node 0 (the DCP shards of their ranks,
the HF Trainer's ``rng_state_<rank>.pth``, Accelerate's ``random_states_<rank>.pkl``), carried into node 0's
checkpoints through the store (stdlib only, Python 3.8).

Each node n >= 1 runs ``PartSync`` beside its workers. A folder entry of its checkpoint folder (``step-200/``,
``checkpoint-500/``) whose files are whole and have not changed for the quiet period is uploaded as a *part*,
``<uri>/node-parts/<entry>/<part>/`` with the part's manifest ``<part>.json`` written last, and the node's index
``<uri>/node-parts/node-<n>.json`` then names it: for every folder entry the node holds, the part that holds it, or
null while it is being written; the paths of the files it holds in each (``files``); ``final`` once the workers have
exited and everything is uploaded. The index is rewritten before the workers start, so node 0 never reads an earlier
run's.

A node's silence about a folder is not a fact until node 0 knows the node looked after the save was over: node 0
writes a question, ``<uri>/node-parts/ask.json`` (a word of its own), and each node answers it in its index
(``looked``) from a look at its folder taken after it read the question. Only then does an entry a node does not list
mean that node wrote nothing into it (no clocks are compared: the store's own order of writes and reads decides).

Node 0 (``NodeParts``) takes a folder entry into a checkpoint only with every other node's part of it: an entry a
node's index lists as being written holds the checkpoint back, one it does not list is one that node wrote nothing
into. Node 0 publishes each part with its own files as one checkpoint, then removes it from the store. Where the
store copies objects itself (S3, GCS, Azure Blob, file://: ``storage.copier``) the part's files are copied into the
checkpoint there, so other nodes' shards never pass through node 0 (at 8 nodes, 7/8 of every save would otherwise
be downloaded by node 0 and uploaded again); with a store plugin that cannot, node 0 downloads each part once (kept
beside its checkpoint folder while it runs), verified against the part's manifest, and uploads it. Files node 0
holds under the same name are node 0's.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, NamedTuple
from urllib.parse import quote

from cloudtrain import safe_json, storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.download import fetch_objects, log_line, matches
from cloudtrain.checkpoint.files import Files, broken, containers, entry_of, marker_missing, scan, state_of
from cloudtrain.checkpoint.manifest import checked_files, safe_relative
from cloudtrain.errors import CloudtrainError

PARTS = "node-parts"
RESTORED = "restored"  # an index's word for an entry the node holds as its restore put it there
FINAL_WAIT = 120.0  # seconds node 0 waits, once its workers exited, for the other nodes' last parts
CLOSE_WAIT = 15.0  # seconds node 0 waits at its end for the other nodes' last word, when it needed none of it

Log = Callable[[str], None]


class Part(NamedTuple):
    """A part node 0 takes into a checkpoint: its files under ``root``, the part's folder in the store (a URI) or
    node 0's download of it (a Path); their paths as in the checkpoint folder."""

    entry: str
    name: str
    root: Path | str
    files: list[dict[str, Any]]


def within(part: Part, folder: str) -> Path | str:
    """Where the part's files of ``folder`` (a folder entry it holds) are: the ``root`` of paths relative to it."""
    return part.root / folder if isinstance(part.root, Path) else storage.join(part.root, folder)


def folder_entries(files: Files) -> dict[str, Files]:
    """The folder entries among ``files`` (a top-level folder, or a family member one level down in a folder that
    holds nothing but such members): the units a save of several ranks writes into."""
    boxes = containers(files)
    found: dict[str, Files] = {}
    for rel, state in files.items():
        entry = entry_of(rel, boxes)
        if rel != entry:
            found.setdefault(entry, {})[rel] = state
    return found


def _index_uri(uri: str, node: int) -> str:
    return storage.join(uri, PARTS, f"node-{node}.json")


def _part_uri(uri: str, entry: str, part: str) -> str:
    return storage.join(uri, PARTS, quote(entry, safe=""), part)


class Index(NamedTuple):
    entries: dict[str, str | None]  # folder entry -> part name, RESTORED, or None while it is being written
    final: bool
    files: dict[str, list[str]] = {}  # folder entry -> the paths of the files the node's ranks wrote into it
    looked: str | None = None  # the last question of node 0's (ask.json) this listing was taken after


def _ask_uri(uri: str) -> str:
    return storage.join(uri, PARTS, "ask.json")


def read_ask(uri: str) -> str | None:
    """Node 0's current question (ask.json), or None where there is none or it is not one."""
    try:
        data = safe_json.loads(storage.read_bytes(_ask_uri(uri)), _ask_uri(uri))
    except Exception:  # none asked yet (each store says "not found" its own way), or unreadable: no question
        return None
    ask = data.get("ask") if isinstance(data, dict) else None
    return ask if isinstance(ask, str) else None


def read_index(uri: str, node: int) -> Index | None:
    """Node ``node``'s index; None where there is none or it is not one (a hand-written or foreign file)."""
    try:
        data = safe_json.loads(storage.read_bytes(_index_uri(uri, node)), _index_uri(uri, node))
    except (CloudtrainError, OSError, ValueError):  # safe_json.UnreadableJson is both
        return None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                                for k, v in entries.items()):
        return None
    files = data.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, list)
                                              and all(isinstance(p, str) for p in v) for k, v in files.items()):
        return None
    looked = data.get("looked")
    return Index(entries, data.get("final") is True, files, looked if isinstance(looked, str) else None)


class PartSync:
    """What node n >= 1 runs around its workers for one checkpoint folder (the bootstrap's ``PlainSync`` on node
    0): uploads its folder entries as parts from a thread while the workers run, and everything whole once they
    exited (``finish``)."""

    LOOK_EVERY = 1.0

    def __init__(self, root: Path, uri: str, node: int, quiet: float, log: Log | None = None,
                 thread: bool = True) -> None:
        self.root, self.uri, self.node, self.quiet = root, uri, node, quiet
        self.log = log or log_line
        self.token = f"node-{node}-{uuid.uuid4().hex[:8]}"
        self.count = 0
        self.seen: dict[str, Files] = {}
        self.changed_at: dict[str, float] = {}
        self.parts: dict[str, tuple[Files, str]] = {}  # entry -> (its files as uploaded, the part holding them)
        self.left: dict[str, str] = {}  # after the final poll: entries not uploaded, with why
        self.written: Index | None = None
        self._remove_earlier_parts()
        for entry, files in folder_entries(self._scan()).items():  # restored: node 0 holds them too
            self.parts[entry] = (files, RESTORED)
            self.seen[entry] = files
        try:  # before the workers start: node 0 never reads an earlier run's index
            self._write_index(final=False)
        except (CloudtrainError, OSError) as exc:  # node 0 then publishes no folder this node may hold part of
            self.log(f"warning: could not write this node's checkpoint index under {self.uri} ({exc})")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudtrain-checkpoint-parts", daemon=True)
        if thread:
            self._thread.start()

    def _scan(self) -> Files:
        if (self.root / checkpoint_store.RUNTIME_MARKER).exists():
            return {}  # the Checkpointer publishes its own folder from every rank
        return scan(self.root)

    def _remove_earlier_parts(self) -> None:
        """Parts this node uploaded in an earlier run that no checkpoint took (a preemption between the upload and
        node 0's publish)."""
        try:
            store = storage.store_for(self.uri)
            stale = [u for u in store.list(storage.join(self.uri, PARTS))
                     if f"/node-{self.node}-" in u[len(storage.join(self.uri, PARTS)):]]
            if stale:
                store.delete(stale)
        except (CloudtrainError, OSError) as exc:
            self.log(f"could not remove this node's earlier checkpoint parts under {self.uri} ({exc})")

    def _write_index(self, final: bool, looked: str | None = None) -> None:
        current = {entry: part for entry, (files, part) in self.parts.items() if self.seen.get(entry) == files}
        pending = {entry: None for entry in self.seen if entry not in current}
        written = {entry: sorted(files) for entry, files in self.seen.items() if current.get(entry) != RESTORED}
        index = Index({**pending, **current}, final, written, looked)
        if index == self.written:
            return
        data = json.dumps({"node": self.node, "final": final, "entries": index.entries, "files": index.files,
                           "looked": looked}, indent=1).encode()
        storage.with_retries(lambda: storage.write_bytes(_index_uri(self.uri, self.node), data),
                             f"writing {_index_uri(self.uri, self.node)}", log=self.log)
        self.written = index

    def _upload(self, entry: str, files: Files) -> str | None:
        """Upload one entry as a part; returns its name, or None where a file changed while it was read."""
        self.count += 1
        part = f"{self.token}-{self.count}"
        folder = _part_uri(self.uri, entry, part)
        rels = sorted(files)
        described = checkpoint_store.describe_and_upload(self.root, rels, folder, log=self.log)
        if any(state_of(self.root / rel) != files[rel] for rel in rels):
            return None  # rewritten while it was read: the next look uploads it again
        manifest = json.dumps({"node": self.node, "entry": entry, "files": described}, indent=1).encode()
        storage.with_retries(lambda: storage.write_bytes(folder + ".json", manifest), f"writing {folder}.json",
                             log=self.log)
        return part

    def _forget(self, part: str, entry: str) -> None:
        if part == RESTORED:
            return
        folder = _part_uri(self.uri, entry, part)
        try:
            store = storage.store_for(folder)
            store.delete([*store.list(folder), folder + ".json"])
        except (CloudtrainError, OSError):
            pass  # node 0 removes what it took; the next run's start removes the rest

    def poll(self, final: bool = False) -> None:
        asked = read_ask(self.uri)  # read before the look: the listing below answers it
        now = time.monotonic()
        current = folder_entries(self._scan())
        for entry, files in current.items():
            if self.seen.get(entry) != files:
                self.changed_at[entry] = now
        self.seen = current
        for entry in [e for e in self.parts if e not in current]:  # removed by the script (its own retention)
            self._forget(self.parts.pop(entry)[1], entry)
        for entry, files in sorted(current.items()):
            if entry in self.parts and self.parts[entry][0] == files:
                continue
            if not final and now - self.changed_at.get(entry, now) < self.quiet:
                continue  # being written
            why = broken(self.root, files)
            if why:
                if final:
                    self.left[entry] = why
                continue
            part = self._upload(entry, files)
            if part is not None:
                old = self.parts.get(entry)
                self.parts[entry] = (files, part)
                if old:
                    self._forget(old[1], entry)
        self._write_index(final, asked)

    def _run(self) -> None:
        while not self._stop.wait(self.LOOK_EVERY):
            try:
                self.poll()
            except Exception as exc:  # the final poll tries again
                self.log(f"warning: uploading this node's checkpoint files failed ({exc}); trying again")

    def finish(self, succeeded: bool = True) -> str | None:
        """After the workers exited: upload every whole entry and say ``final``. Returns why this node's files could
        not reach the store (node 0 then publishes no checkpoint that needed them), or None. (Whether the workers
        succeeded is node 0's to weigh.)"""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.poll(final=True)
        except Exception as exc:
            return (f"this node's checkpoint files could not be uploaded to {self.uri} ({exc}); they are still in "
                    f"{self.root}")
        return None

    def unpublished(self) -> list[str]:
        return [f"not published (it stays on this node only): {self.root / entry} ({why})"
                for entry, why in sorted(self.left.items())]


class NodeParts:
    """Node 0's view of the other nodes' parts (see the module's words)."""

    def __init__(self, uri: str, nodes: int, staging: Path, log: Log | None = None,
                 final_wait: float = FINAL_WAIT) -> None:
        self.uri, self.nodes, self.staging, self.final_wait = uri, nodes, staging, final_wait
        self.log = log or log_line
        self.seen: dict[str, Part] = {}  # part name -> where its files are taken from
        self.all_final: bool | None = None  # every other node said it uploaded all it will (wait_final)
        self.token, self.asks = uuid.uuid4().hex[:8], 0  # node 0's questions (ask.json): this run's own words
        self.read: dict[int, Index | None] = {}  # the indexes as last read (refresh)

    def _indexes(self) -> dict[int, Index | None]:
        self.read = {node: read_index(self.uri, node) for node in range(1, self.nodes)}
        return self.read

    def refresh(self) -> None:
        """Read every other node's index once (a poll's counts and listings use what was read here)."""
        self._indexes()

    def listed(self, entry: str) -> list[str]:
        """The files other nodes' ranks wrote into a folder entry, as their indexes last read say."""
        return [rel for index in self.read.values() if index is not None for rel in index.files.get(entry, [])]

    def ask(self) -> str:
        """A new question for every other node: look at your folder again and say what you hold. Returns it."""
        self.asks += 1
        question = f"{self.token}-{self.asks}"
        data = json.dumps({"ask": question}).encode()
        storage.with_retries(lambda: storage.write_bytes(_ask_uri(self.uri), data), f"writing {_ask_uri(self.uri)}",
                             log=self.log)
        return question

    def looked(self, question: str) -> bool:
        """Whether every other node has answered ``question`` (or said its last word), so that what its index
        lists is what it held after the question was asked."""
        return all(index is not None and (index.final or index.looked == question)
                   for index in self._indexes().values())

    def wait_final(self, timeout: float | None = None) -> bool:
        """Once node 0's workers exited: wait (at most ``final_wait``, or ``timeout``; once) for every other node to
        say its parts are all uploaded. Returns whether all did."""
        if self.all_final is None:
            deadline = time.monotonic() + (self.final_wait if timeout is None else timeout)
            while not all(index is not None and index.final for index in self._indexes().values()):
                if time.monotonic() >= deadline:
                    self.all_final = False
                    return False
                time.sleep(0.5)
            self.all_final = True
        return self.all_final

    def gather(self, entries: list[str], final: bool) -> tuple[dict[str, list[Part]], dict[str, str]]:
        """For node 0's folder entries about to be published: the other nodes' parts of each, and the entries that
        cannot be published now, with why (a part still being written, or never uploaded)."""
        found: dict[str, list[Part]] = {entry: [] for entry in entries}
        problems: dict[str, str] = {}
        if not entries:
            return found, problems
        for node, index in self._indexes().items():
            if index is None:
                for entry in entries:
                    problems.setdefault(entry, f"node {node} said nothing of its checkpoint files (no index in "
                                               f"{storage.join(self.uri, PARTS)})")
                continue
            for entry in entries:
                part = index.entries.get(entry, RESTORED)
                if part == RESTORED:
                    continue  # nothing of it on that node, or only what its restore put there (node 0 has that)
                if part is None:
                    when = "still being written when it ended" if final else "not uploaded yet"
                    problems.setdefault(entry, f"node {node}'s files of it were {when}")
                    continue
                try:
                    found[entry].append(self._take(entry, part))
                except (CloudtrainError, OSError, ValueError) as exc:
                    problems.setdefault(entry, f"node {node}'s files of it could not be read ({exc})")
        return found, problems

    def complete(self, entries: list[str], own: list[str], final: bool,
                 world_size: int) -> tuple[dict[str, list[Part]], dict[str, str]]:
        """``gather`` for node 0's folder entries (``own``: node 0's files of them, paths in the checkpoint folder),
        waiting for the other nodes' last word once the workers exited, and holding back a DCP folder whose shards,
        counted over every node, lack a rank's."""
        if final:
            self.wait_final()
        found, problems = self.gather(entries, final)
        for entry in entries:
            names = [rel for rel in own if rel.startswith(entry + "/")]
            names += [f["path"] for part in found[entry] for f in part.files]
            missing = marker_missing(entry, names, world_size)
            if missing and entry not in problems:
                problems[entry] = f"no node holds its {missing}"
        return found, problems

    def _take(self, entry: str, part: str) -> Part:
        """The part, from its manifest: left in the store where the store copies objects itself (the publish
        checks each copy's size; a restore verifies every sha256), else downloaded and verified here."""
        if part in self.seen:
            return self.seen[part]
        folder = _part_uri(self.uri, entry, part)
        manifest = safe_json.loads(storage.read_bytes(folder + ".json"), folder + ".json")
        files = checked_files({"step": 0, "files": manifest.get("files") if isinstance(manifest, dict) else None}, 0)
        if any(not safe_relative(f["path"]) or not f["path"].startswith(entry + "/") for f in files):
            raise ValueError(f"{folder}.json lists a file outside {entry}")
        if storage.copier(folder) is not None:
            self.seen[part] = Part(entry, part, folder, files)
            return self.seen[part]
        local = self.staging / part
        shutil.rmtree(local, ignore_errors=True)
        items = []
        for f in files:
            (local / f["path"]).parent.mkdir(parents=True, exist_ok=True)
            items.append((storage.join(folder, f["path"]), local / f["path"], int(f["size"])))
        fetched = fetch_objects(storage.store_for(folder), items, False, self.log)
        wrong = [f["path"] for f, got in zip(files, fetched) if not matches(f, got)]
        if wrong:
            shutil.rmtree(local, ignore_errors=True)
            raise ValueError(f"{wrong[0]} does not match its part's manifest")
        self.seen[part] = Part(entry, part, local, files)
        return self.seen[part]

    def taken(self, parts: list[Part], published: str | None = None) -> None:
        """After a publish: the parts it holds leave the store. A later checkpoint may need a part again (an entry
        node n left unchanged is in every snapshot): node 0 keeps its downloads while it runs, and a part the store
        copied is copied from ``published`` next time (the checkpoint that holds its files under their own paths;
        without it, the part is read anew and found gone, and that checkpoint waits)."""
        for part in parts:
            if isinstance(part.root, str):
                if published is None:
                    self.seen.pop(part.name, None)
                else:
                    self.seen[part.name] = part._replace(root=published)
            folder = _part_uri(self.uri, part.entry, part.name)
            try:
                store = storage.store_for(folder)
                store.delete([*store.list(folder), folder + ".json"])
            except (CloudtrainError, OSError):
                pass  # the next run's nodes remove their own leftovers

    def close(self) -> None:
        """At the end of node 0's run: its copies go, and where every node said it uploaded all it will, the store's
        part folder too (what a node left unsaid, its next run's start removes)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        # the other nodes end with node 0 (their workers stop together): a few seconds for their last word, so a
        # run that published nothing through parts (the Checkpointer's own folder) leaves no index behind either
        if self.wait_final(CLOSE_WAIT):
            try:
                store = storage.store_for(self.uri)
                leftover = store.list(storage.join(self.uri, PARTS))
                if leftover:
                    store.delete(leftover)
                getattr(store, "prune_empty", lambda _uri: None)(storage.join(self.uri, PARTS))  # file://'s folders
            except (CloudtrainError, OSError) as exc:
                self.log(f"could not remove {storage.join(self.uri, PARTS)} ({exc})")
