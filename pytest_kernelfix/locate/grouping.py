"""Group failures into bugs: one heal per bug, verified against all of its tests.

Parametrized kernel tests commonly fail 10-50 times from one bug, and one broken helper
can fail the tests of every kernel that calls it. Two failures with the same normalised
error signature are one bug when they share their editable files, or when their fault is
attributed to the same definition (:func:`fault_of`: the project definition the error was
raised in, else the project kernels the test launched), whichever kernel or wrapper
reached it. The editable files are where the fault may be: the traceback, the launched
kernels, the launch sites and what :mod:`pytest_kernelfix.locate.reach` finds from them
through the project's imports. A bug's definitions follow the jit branches its failures'
launches took (their constexpr values), and those its tests' ids name rank first.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure, PassedTest
from pytest_kernelfix.locate.branches import Env, constexpr_env
from pytest_kernelfix.locate.reach import Located, Reach, Seeds, rank_by_words, seeds_of
from pytest_kernelfix.locate.signals import (
    check_frames,
    checks_gradients,
    expects_raise,
    involves_gradients,
    returned_by,
)
from pytest_kernelfix.project import Project

#: Files one bug may edit, at most (the closest to the fault first).
MAX_EDITABLE_FILES = 8


@dataclass(frozen=True)
class BugGroup:
    """One bug: its failing tests, the files a fix may edit, and a stable id; ``kernel``
    is what it is named after (a kernel, or the wrapper that raised)."""

    id: str
    kernel: str
    signature: str
    editable: tuple[str, ...]
    failures: tuple[Failure, ...]
    located: tuple[Located, ...] = ()
    #: Files the fix would start from that cannot be read as UTF-8, each with why: the
    #: bug is not healed (``"kernels/k.py is encoded as latin-1 ..."``).
    unreadable: tuple[str, ...] = ()

    @property
    def nodeids(self) -> tuple[str, ...]:
        return tuple(failure.nodeid for failure in self.failures)

    @property
    def first(self) -> Failure:
        return self.failures[0]


def failure_seeds(failure: Failure, *, constexprs: bool = False,
                  project: Project | None = None) -> Seeds:
    """What the test run recorded about ``failure``, as reach reads it. Without the
    launches' ``constexprs`` (which jit branches they took), every case of a
    parametrized test that failed the same way has the same seeds; with the ``project``,
    whether the check that failed reads gradients."""
    checks = {frame for frame in check_frames(failure, project)  # an assertion helper
              if project.is_source(frame.path)} if project is not None else set()
    return seeds_of(
        [(frame.path, frame.lineno) for frame in failure.error.frames if frame not in checks],
        [(launch.file, launch.line, [(f, n, name) for f, n, name in launch.sites])
         for launch in failure.launches],
        failure.test_path,
        failure.nodeid,
        [constexpr_env(launch.constexprs, launch.exact) for launch in failure.launches]
        if constexprs else (),
        gradients=involves_gradients(failure),
        expects_raise=expects_raise(failure),
        gradient_check=project is not None and checks_gradients(failure, project),
        returned_by=returned_by(failure),
    )


def group_seeds(failures: Sequence[Failure], project: Project | None = None) -> Seeds:
    """The seeds of one bug: its first failure's, with the constexpr values every
    failure launched the same kernels with, so that a jit function is followed on each
    branch one of its tests took (and only those)."""
    first, *others = [failure_seeds(failure, constexprs=True, project=project)
                      for failure in failures[:64]]

    def launched(seeds: Seeds) -> Iterable[tuple[tuple[str, int], Env]]:
        return zip(seeds.kernels, seeds.constexprs or [()] * len(seeds.kernels), strict=True)

    kernels = set(first.kernels)
    launches = dict.fromkeys(pair for seeds in (first, *others) for pair in launched(seeds)
                             if pair[0] in kernels)
    return replace(first, kernels=tuple(kernel for kernel, _ in launches),
                   constexprs=tuple(values for _, values in launches))


def editable_files(
    failure: Failure, project: Project, located: tuple[Located, ...] | None = None
) -> tuple[str, ...]:
    """Project Python files where the fault may be, relative paths, closest first.

    Order: the files of the definitions reach found, by tier and score (the frame that
    raised and the launching functions, the kernels, their helpers), then traceback
    files innermost first, launched kernels' files, the launch sites' files innermost
    first. The project decides which files may be edited at all.
    """
    if located is None:
        located = Reach(project).locate(failure_seeds(failure, project=project))
    candidates = [str(project.root / item.path) for item in located if item.pinned]
    candidates += [frame.path for frame in reversed(failure.error.frames)]
    candidates += [launch.file for launch in failure.launches]
    candidates += [site[0] for launch in failure.launches for site in launch.sites]
    candidates += [str(project.root / item.path) for item in located]
    found = project.editable_files(candidates, exclude=[failure.test_path])
    return found[:MAX_EDITABLE_FILES]


def unreadable_files(failure: Failure, project: Project,
                     known: dict[str, str] | None = None) -> tuple[str, ...]:
    """The project sources a fix of ``failure`` starts from (its traceback, its launched
    kernels, their launch sites) that are refused for their encoding, each with why;
    ``known`` keeps what was found per path, across failures."""
    known = {} if known is None else known
    paths = [frame.path for frame in reversed(failure.error.frames)]
    paths += [launch.file for launch in failure.launches]
    paths += [site[0] for launch in failure.launches for site in launch.sites]
    found = []
    for path in dict.fromkeys(paths):
        if path and path != failure.test_path:
            if path not in known:
                known[path] = project.undecodable(path)
            found.append(known[path])
    return tuple(dict.fromkeys(why for why in found if why))


Fault = tuple[tuple[str, str], ...]


def fault_of(failure: Failure, project: Project, reach: Reach) -> Fault:
    """The definitions ``failure`` is attributed to, as (relative path, qualname): the
    one its error was raised in (the innermost traceback frame in the project's own
    source), else the project kernels it launched (a wrong value checked by the test).
    Empty when neither is known."""
    for frame in reversed(failure.error.frames):
        if frame.path and reach.readable(frame.path):
            return (_definition(frame.path, frame.lineno, frame.name, project, reach),)
    return tuple(sorted({_definition(launch.file, launch.line, launch.name, project, reach)
                         for launch in failure.launches
                         if launch.file and reach.readable(launch.file)}))


def _definition(path: str, line: int, name: str, project: Project, reach: Reach) -> (
    tuple[str, str]
):
    index = reach.module(path)
    found = index.at(line) if index is not None else None
    return project.relative(path), found.qualname if found is not None else name


def _bug_name(failure: Failure, editable: tuple[str, ...], project: Project,
             reach: Reach) -> str:
    """What the bug is named after: the kernel that raised; the kernel launched at the
    project line that raised (a launch the compiler or the launcher refused); the project
    function that raised a Python exception (a wrapper, not a kernel it launched
    before); for a check of gradients the first kernel launched from a ``backward`` (the
    one every gradient goes through); else the first launched."""
    ours = [launch for launch in failure.launches if project.contains(launch.file)]
    launched = {launch.name for launch in ours}
    for frame in reversed(failure.error.frames):
        if frame.name in launched:
            return frame.name
    checks = set(check_frames(failure, project))  # an assertion helper did not raise it
    raised = next((frame for frame in reversed(failure.error.frames)
                   if project.is_source(frame.path) and frame not in checks), None)
    if raised is not None:
        at_launch = [launch.name for launch in ours if any(
            file == raised.path and line == raised.lineno for file, line, _ in launch.sites)]
        if at_launch:
            return at_launch[-1]
        index = reach.module(raised.path)
        found = index.at(raised.lineno) if index is not None else None
        if found is not None and not found.jit:
            return found.qualname
    backward = [launch.name for launch in ours
                if any(name == "backward" for _, _, name in launch.sites)]
    if backward and checks_gradients(failure, project):
        return backward[0]
    for launch in failure.launches:
        if project.contains(launch.file) and project.relative(launch.file) in editable:
            return launch.name
    for frame in reversed(failure.error.frames):
        if project.contains(frame.path) and project.relative(frame.path) in editable:
            return frame.name
    return PurePosixPath(editable[0]).stem if editable else "test"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-") or "bug"


def group_id(kernel: str, error_type: str, signature: str, editable: Iterable[str]) -> str:
    """``<kernel>-<error type>-<6 hex>``: readable, stable across runs, unique per bug."""
    digest = hashlib.sha1("\n".join([signature, *sorted(editable)]).encode()).hexdigest()[:6]
    return f"{_slug(kernel)}-{_slug(error_type)}-{digest}"


def group_failures(
    failures: Sequence[Failure], project: Project, reach: Reach | None = None,
    passed: Sequence[PassedTest] = (),
) -> list[BugGroup]:
    """Groups in order of first failure; failures without editable files form their own.

    Failures with the same error signature join when they share their sorted editable
    files (the same code), their attributed fault (:func:`fault_of`: one definition
    raised in, or one kernel checked, whichever kernel or wrapper reached it), or, for
    wrong values checked by the test, a helper every kernel they launched calls (a
    ``@triton.jit`` function, or a function that sizes the launch) and that no launch of a
    ``passed`` test reaches (:class:`_Helpers`). A
    group joined from several file sets is named after the smallest of them, so that its
    id does not depend on the order the failures arrived in; its editable files are the
    shared definitions' first, then those of each set, up to :data:`MAX_EDITABLE_FILES`.
    """
    reach = reach or Reach(project)
    by_seeds: dict[Seeds, tuple[tuple[str, ...], tuple[Located, ...]]] = {}
    keys: list[tuple[tuple[str, ...], str]] = []
    joins: list[list[Hashable]] = []  # per failure: what joins it to others
    shared: list[set[tuple[str, str]]] = []  # per failure: definitions it may share
    helpers = _Helpers(project, reach, passed)
    for failure in failures:
        seeds = failure_seeds(failure, project=project)  # equal seeds: same definitions
        if seeds not in by_seeds:
            located = reach.locate(seeds)
            by_seeds[seeds] = (editable_files(failure, project, located), located)
        editable, located = by_seeds[seeds]
        signature = failure.error.signature()
        keys.append((tuple(sorted(editable)), signature))
        fault = fault_of(failure, project, reach)
        suspects = helpers.suspects(failure, fault, located)
        joins.append([("files", keys[-1]), *((("fault", fault, signature),) if fault else ()),
                      *(("helper", helper, signature) for helper in suspects)])
        shared.append({*fault, *suspects})
    refusals: dict[str, str] = {}  # path -> why its encoding is refused ("": it is not)
    groups = []
    for indices in partition(joins):
        parts: dict[tuple[tuple[str, ...], str], list[Failure]] = {}
        for index in indices:
            parts.setdefault(keys[index], []).append(failures[index])
        lead_key = min(parts)
        lead = parts[lead_key]
        members = [*lead, *(failures[i] for i in indices if keys[i] != lead_key)]
        located = reach.locate(group_seeds(lead, project))
        editable = editable_files(lead[0], project, located)
        if len(parts) > 1:
            common = set.intersection(*(shared[i] for i in indices))
            first = [path for path, _ in sorted(common) if project.editable(
                str(project.root / path))]
            rest = [path for key in parts for path in key[0]]
            editable = tuple(dict.fromkeys([*first, *editable, *rest]))[:MAX_EDITABLE_FILES]
        kernel = _bug_name(lead[0], editable, project, reach)
        gid = group_id(kernel, lead[0].error.type, lead_key[1], editable)
        shown = rank_by_words([item for item in located if item.path in editable],
                              [member.nodeid for member in members])
        refused = [why for member in members
                   for why in unreadable_files(member, project, refusals)]
        groups.append(BugGroup(gid, kernel, lead_key[1], editable, tuple(members), shown,
                               tuple(dict.fromkeys(refused))))
    return groups


def partition(keys: Sequence[Iterable[Hashable]]) -> list[list[int]]:
    """Indices of ``keys`` joined when they share a key, directly or through others:
    each part in index order, the parts ordered by their first index."""
    parent = list(range(len(keys)))

    def find(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    owner: dict[Hashable, int] = {}
    for index, own in enumerate(keys):
        for key in own:
            if key in owner:
                parent[find(index)] = find(owner[key])
            else:
                owner[key] = index
    parts: dict[int, list[int]] = {}
    for index in range(len(keys)):
        parts.setdefault(find(index), []).append(index)
    return sorted(parts.values(), key=lambda part: part[0])


def _raised(failure: Failure, reach: Reach) -> bool:
    """The error was raised in the project's own source (not by the test's check)."""
    return any(frame.path and reach.readable(frame.path) for frame in failure.error.frames)


class _Helpers:
    """Which shared helpers may hold the fault of a wrong value: the ``@triton.jit``
    helpers the kernels a failing test launched call, and the project functions that size
    those launches (block sizes, warps), when no launch of a passing test reaches them."""

    def __init__(self, project: Project, reach: Reach, passed: Sequence[PassedTest]) -> None:
        self.project = project
        self.reach = reach
        self.passed = passed
        self._exercised: set[tuple[str, str]] | None = None

    def suspects(self, failure: Failure, fault: Fault, located: Sequence[Located]) -> (
        tuple[tuple[str, str], ...]
    ):
        """The failure's suspect helpers: none when its error was raised in project code
        (that definition is its fault) or it launched no project kernel, and none when no
        passing test launched a project kernel: without a launch that worked there is no
        contrast (``--lf``, a suite where everything fails), and joining independent bugs
        on a guess costs a heal, while keeping one cause apart costs a re-verification."""
        if not fault or _raised(failure, self.reach) or not self.contrast:
            return ()
        found = [key for key in _helpers(located, failure.launches, self.project, self.reach)
                 if key not in fault]
        if not found:
            return ()
        exercised = self.exercised()
        return tuple(key for key in found if key not in exercised)

    @functools.cached_property
    def contrast(self) -> bool:
        """Whether a passing test launched a kernel of the project's own (worked out
        once)."""
        return any(launch.file and self.reach.readable(launch.file)
                   for test in self.passed for launch in test.launches)

    def exercised(self) -> set[tuple[str, str]]:
        """The helpers the launches of passing tests reach (worked out once)."""
        if self._exercised is None:
            self._exercised = set()
            seen: set[tuple[str, int, str]] = set()
            for test in self.passed:
                for launch in test.launches:
                    site = launch.sites[0][0] if launch.sites else ""
                    if (launch.file, launch.line, site) in seen or not launch.file or (
                            not self.reach.readable(launch.file)):
                        continue
                    seen.add((launch.file, launch.line, site))
                    located = self.reach.locate(seeds_of(
                        [], [(launch.file, launch.line, launch.sites)]))
                    self._exercised.update(
                        _helpers(located, (launch,), self.project, self.reach))
        return self._exercised


def _helpers(located: Sequence[Located], launches: Sequence[KernelLaunch], project: Project,
             reach: Reach) -> list[tuple[str, str]]:
    """The jit functions and the launch-sizing functions among ``located``, less the
    functions that launched (each wrapper is its kernel's own)."""
    launchers = {_definition(site[0], site[1], site[2], project, reach)
                 for launch in launches for site in launch.sites[:1]
                 if reach.readable(site[0])}
    return [item.key for item in located
            if (item.jit or item.pinned) and item.key not in launchers]


def launch_files(launch: KernelLaunch, project: Project, reach: Reach) -> set[str]:
    """Project files a launch depends on: the kernel's, its jit helpers', its launcher's."""
    files = set()
    if project.contains(launch.file):
        files.add(project.relative(launch.file))
    if launch.sites and project.contains(launch.sites[0][0]):
        files.add(project.relative(launch.sites[0][0]))
    if launch.file and reach.readable(launch.file):
        for item in reach.locate(seeds_of([], [(launch.file, launch.line, ())])):
            if item.jit:
                files.add(item.path)
    return files


def regression_nodeids(
    group: BugGroup, passed: Iterable[PassedTest], project: Project, reach: Reach | None = None
) -> tuple[str, ...]:
    """Tests that passed in the session and depend on a file the bug may edit: they
    launched a kernel defined there, launched one from a wrapper there, or launched one
    whose ``@triton.jit`` helpers live there."""
    reach = reach or Reach(project)
    editable = set(group.editable)
    chosen = []
    cache: dict[tuple[KernelLaunch, str], set[str]] = {}
    for test in passed:
        files: set[str] = set()
        for launch in test.launches:
            # launches compare without their sites, and launch_files reads the wrapper's
            key = (launch, launch.sites[0][0] if launch.sites else "")
            if key not in cache:
                cache[key] = launch_files(launch, project, reach)
            files |= cache[key]
        if files & editable:
            chosen.append(test.nodeid)
    return tuple(chosen)
