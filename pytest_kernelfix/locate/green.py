"""The last green state of each kernel test, kept in pytest's cache: a base without git.

Every healing session records, the way pytest records ``lastfailed``, the state of the
project's Python files (a sha256 per file) at which each selected kernel test passed,
and keeps a snapshot of those files, content-addressed, so that a file stored once is
not stored again: after the first session only the files that changed are written. When
a test fails later, the files that differ from its last green state, with their text
then, are a :class:`~pytest_kernelfix.locate.change.Change`, git or not.

The store is bounded: at most :data:`MAX_STATES` states (the newest that some test still
passed at) and :data:`MAX_BYTES` of snapshots; files over 256 KiB and projects over
:data:`MAX_FILES` files are not snapshotted beyond the limit. Every file is written whole
and put in place by one rename, so an interrupted session leaves the last good index.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pytest_kernelfix.atomic import replace_file
from pytest_kernelfix.fields import read
from pytest_kernelfix.locate.change import Change, FileChange
from pytest_kernelfix.project import MAX_EDITABLE_BYTES, Project, walk_files

INDEX = "index.json"
VERSION = 1
#: States kept at most (each is the files' hashes at which some test last passed).
MAX_STATES = 8
#: Snapshot bytes kept at most; the oldest states go first.
MAX_BYTES = 32 * 1024 * 1024
#: Python files of the project hashed and snapshotted at most.
MAX_FILES = 4_000


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def project_files(project: Project, skip: Iterable[Path] = ()) -> Iterator[str]:
    """The project's own Python files (sources and tests), rootdir-relative: no hidden
    folder, virtualenv, cache or installed package, nothing under ``skip``."""
    count = 0
    for path in walk_files(project.root, skip):
        if not path.endswith(".py") or os.path.islink(path) or not project.contains(path):
            continue
        yield project.relative(path)
        count += 1
        if count >= MAX_FILES:
            return


@dataclass(frozen=True)
class GreenState:
    """The files' hashes at which a test last passed, and when."""

    id: str
    time: float
    files: Mapping[str, str]


@dataclass(frozen=True)
class _Stored:
    time: float
    files: Mapping[str, str]


@dataclass(frozen=True)
class _Index:
    """``index.json``: each state by its id, and the state each test last passed at."""

    version: int = VERSION
    states: Mapping[str, _Stored] = field(default_factory=dict)
    tests: Mapping[str, str] = field(default_factory=dict)


class GreenStore:
    """The record in ``folder`` (``<pytest cache>/d/kernelfix-green``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    # -- reading ---------------------------------------------------------------------

    def _index(self) -> _Index:
        """The record, or an empty one when there is none this version can read."""
        try:
            index = read(_Index, json.loads((self.folder / INDEX).read_text(encoding="utf-8")))
        except (OSError, ValueError):  # none, or not one of ours (a FieldError)
            return _Index()
        return index if index.version == VERSION else _Index()

    def state(self, nodeid: str) -> GreenState | None:
        """The state at which ``nodeid`` last passed, if it is recorded."""
        index = self._index()
        sid = index.tests.get(nodeid)
        stored = index.states.get(sid) if sid is not None else None
        if sid is None or stored is None:
            return None
        return GreenState(sid, stored.time, dict(stored.files))

    def text(self, sha: str) -> str | None:
        try:
            return (self.folder / "blobs" / sha).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def change(self, nodeid: str, project: Project, skip: Iterable[Path] = ()
               ) -> Change | None:
        """The files that differ from ``nodeid``'s last green state, as a change; None
        when the test has no record or nothing differs."""
        state = self.state(nodeid)
        if state is None:
            return None
        now = {rel: project.root / rel for rel in project_files(project, skip)}
        files: list[FileChange] = []
        missing: list[str] = []
        for rel in sorted(set(state.files) | set(now)):
            current = _read(now[rel]) if rel in now else None
            sha = state.files.get(rel)
            if sha is None:
                if current is not None:
                    files.append(FileChange(rel, None, current, project.is_test_file(rel)))
                continue
            if current is not None and digest(current.encode("utf-8")) == sha:
                continue
            base = self.text(sha)
            if base is None:
                missing.append(rel)
                continue
            files.append(FileChange(rel, base, current, project.is_test_file(rel)))
        if not files:
            return None
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(state.time))
        notes = (f"{len(missing)} changed file(s) have no snapshot of their green text "
                 f"(the store is bounded): {', '.join(missing[:5])}",) if missing else ()
        return Change(f"the last green run of {nodeid} ({when})", tuple(files), notes)

    def differs(self, project: Project, skip: Iterable[Path] = ()) -> bool:
        """Whether the project's files differ from the newest recorded state (a failure
        then has a change to bisect); False without a record."""
        newest = max(self._index().states.values(), key=lambda s: s.time, default=None)
        if newest is None:
            return False
        files = newest.files
        now = set(project_files(project, skip))
        if now != set(files):
            return True
        for rel in now:
            current = _read(project.root / rel)
            if current is None or digest(current.encode("utf-8")) != files[rel]:
                return True
        return False

    # -- writing ---------------------------------------------------------------------

    def record(self, project: Project, nodeids: Iterable[str], skip: Iterable[Path] = (),
               now: float | None = None) -> None:
        """Record the project's files as the state at which ``nodeids`` passed."""
        nodeids = list(nodeids)
        if not nodeids:
            return
        blobs = self.folder / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
        data: dict[str, bytes] = {}
        for rel in project_files(project, skip):
            path = project.root / rel
            try:
                if path.stat().st_size > MAX_EDITABLE_BYTES:
                    continue
                content = path.read_bytes()
            except OSError:
                continue
            files[rel] = digest(content)
            data[files[rel]] = content
        index = self._index()
        sid = digest(json.dumps(sorted(files.items())).encode())[:16]
        index = _Index(VERSION, {**index.states, sid: _Stored(
            time.time() if now is None else now, files)}, {**index.tests, **dict.fromkeys(
                nodeids, sid)})
        sizes = {path.name: path.stat().st_size for path in blobs.iterdir()}
        sizes.update((sha, len(content)) for sha, content in data.items())
        index, kept = self._prune(index, sid, sizes)
        room = MAX_BYTES - sum(sizes[sha] for sha in kept if (blobs / sha).exists())
        for sha in sorted(kept - {path.name for path in blobs.iterdir()}):
            if sha in data and len(data[sha]) <= room:  # the newest state's files
                replace_file(blobs / sha, data[sha])
                room -= len(data[sha])
        for path in blobs.iterdir():
            if path.name not in kept:
                path.unlink(missing_ok=True)
        replace_file(self.folder / INDEX, json.dumps(asdict(index)).encode("utf-8"))

    @staticmethod
    def _prune(index: _Index, newest: str, sizes: Mapping[str, int]) -> tuple[_Index, set[str]]:
        """Keep the newest :data:`MAX_STATES` states some test passed at, and drop the
        oldest while their files' snapshots exceed :data:`MAX_BYTES` (the newest state
        always stays); the index kept, and the snapshots its states hold."""
        used = set(index.tests.values())
        states = {sid: state for sid, state in index.states.items() if sid in used}
        kept = sorted(states, key=lambda sid: (sid != newest, -states[sid].time))
        kept = kept[:MAX_STATES]

        def held(sids: Iterable[str]) -> set[str]:
            return {sha for sid in sids for sha in states[sid].files.values()}

        while len(kept) > 1 and sum(sizes.get(sha, 0) for sha in held(kept)) > MAX_BYTES:
            kept.pop()
        return _Index(VERSION, {sid: states[sid] for sid in kept},
                      {nodeid: sid for nodeid, sid in index.tests.items() if sid in kept}
                      ), held(kept)


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
