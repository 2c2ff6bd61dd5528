"""Group failures into bugs: one heal per bug, verified against all of its tests.

Parametrized kernel tests commonly fail 10-50 times from one bug. Failures that share
their editable files and their normalised error signature are one bug. The editable
files are where the fault may be: the traceback, the launched kernels, the launch sites
and what :mod:`pytest_kernelfix.locate.reach` finds from them through the project's imports.
A bug's definitions follow the jit branches its failures' launches took (their
constexpr values), and those its tests' ids name rank first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
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
)
from pytest_kernelfix.project import Project

#: Files one bug may edit, at most (the closest to the fault first).
MAX_EDITABLE_FILES = 8


@dataclass(frozen=True)
class BugGroup:
    """One bug: its failing tests, the files a fix may edit, and a stable id."""

    id: str
    kernel: str
    signature: str
    editable: tuple[str, ...]
    failures: tuple[Failure, ...]
    located: tuple[Located, ...] = ()

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


def _kernel_name(failure: Failure, editable: tuple[str, ...], project: Project) -> str:
    """The kernel the failing check depends on: one that raised; else the last launched
    from the project function that raised; for a check of gradients the first launched
    from a ``backward`` (the one every gradient goes through); else the first launched."""
    ours = [launch for launch in failure.launches if project.contains(launch.file)]
    launched = {launch.name for launch in ours}
    for frame in reversed(failure.error.frames):
        if frame.name in launched:
            return frame.name
    raised = next((frame for frame in reversed(failure.error.frames)
                   if project.is_source(frame.path)), None)
    if raised is not None:
        from_there = [launch.name for launch in ours if any(
            file == raised.path and name == raised.name for file, _, name in launch.sites)]
        if from_there:
            return from_there[-1]
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
    failures: Sequence[Failure], project: Project, reach: Reach | None = None
) -> list[BugGroup]:
    """Groups in order of first failure; failures without editable files form their own."""
    reach = reach or Reach(project)
    buckets: dict[tuple[tuple[str, ...], str], list[Failure]] = {}
    by_seeds: dict[Seeds, tuple[str, ...]] = {}
    for failure in failures:
        seeds = failure_seeds(failure, project=project)  # equal seeds: same definitions
        if seeds not in by_seeds:
            by_seeds[seeds] = editable_files(failure, project, reach.locate(seeds))
        key = (tuple(sorted(by_seeds[seeds])), failure.error.signature())
        buckets.setdefault(key, []).append(failure)
    groups = []
    for (_, signature), members in buckets.items():
        located = reach.locate(group_seeds(members, project))
        editable = editable_files(members[0], project, located)
        kernel = _kernel_name(members[0], editable, project)
        gid = group_id(kernel, members[0].error.type, signature, editable)
        shown = rank_by_words([item for item in located if item.path in editable],
                              [member.nodeid for member in members])
        groups.append(BugGroup(gid, kernel, signature, editable, tuple(members), shown))
    return groups


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
