"""Group failures into bugs: one heal per bug, verified against all of its tests.

Parametrized kernel tests commonly fail 10-50 times from one bug. Failures that share
their editable files and their normalised error signature are one bug.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from pytest_kernelfix.capture import Failure, PassedTest
from pytest_kernelfix.project import Project


@dataclass(frozen=True)
class BugGroup:
    """One bug: its failing tests, the files a fix may edit, and a stable id."""

    id: str
    kernel: str
    signature: str
    editable: tuple[str, ...]
    failures: tuple[Failure, ...]

    @property
    def nodeids(self) -> tuple[str, ...]:
        return tuple(failure.nodeid for failure in self.failures)

    @property
    def first(self) -> Failure:
        return self.failures[0]


def editable_files(failure: Failure, project: Project) -> tuple[str, ...]:
    """Project Python files in the traceback or holding a launched kernel, relative paths.

    Order: traceback files innermost first (closest to the fault), then launched
    kernels' files. The project decides which files may be edited at all.
    """
    candidates = [frame.path for frame in reversed(failure.error.frames)]
    candidates += [launch.file for launch in failure.launches]
    return project.editable_files(candidates, exclude=[failure.test_path])


def _kernel_name(failure: Failure, editable: tuple[str, ...], project: Project) -> str:
    launched = {launch.name for launch in failure.launches if project.contains(launch.file)}
    for frame in reversed(failure.error.frames):
        if frame.name in launched:
            return frame.name
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


def group_failures(failures: Sequence[Failure], project: Project) -> list[BugGroup]:
    """Groups in order of first failure; failures without editable files form their own."""
    buckets: dict[tuple[tuple[str, ...], str], list[Failure]] = {}
    for failure in failures:
        editable = editable_files(failure, project)
        key = (tuple(sorted(editable)), failure.error.signature())
        buckets.setdefault(key, []).append(failure)
    groups = []
    for (_, signature), members in buckets.items():
        editable = editable_files(members[0], project)
        kernel = _kernel_name(members[0], editable, project)
        gid = group_id(kernel, members[0].error.type, signature, editable)
        groups.append(BugGroup(gid, kernel, signature, editable, tuple(members)))
    return groups


def regression_nodeids(
    group: BugGroup, passed: Iterable[PassedTest], project: Project
) -> tuple[str, ...]:
    """Tests that passed in the session and launched a kernel from a file the bug may edit."""
    editable = set(group.editable)
    chosen = []
    for test in passed:
        files = {
            project.relative(launch.file) for launch in test.launches
            if project.contains(launch.file)
        }
        if files & editable:
            chosen.append(test.nodeid)
    return tuple(chosen)
