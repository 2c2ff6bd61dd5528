"""What a test run leaves for healing: failed kernel tests and the tests that passed.

Where tests run (a plain session or an xdist worker) :func:`report_record` turns one
call phase into a :class:`CaptureRecord`, attached to the report as JSON primitives; where
reports are collected (the plain session or the xdist controller) :func:`read_record`
reads it back strictly and turns it into :class:`Failure` or :class:`PassedTest`, and
:class:`Selection` decides which failures are healed (the others are :class:`Unselected`,
with the reason). A test that crashed an xdist worker becomes a :func:`crash_failure`.
Nothing here holds a live object.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelfix import kernels
from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.config import SELECT_WORDS
from pytest_kernelfix.fields import read
from pytest_kernelfix.project import Project, is_within

#: Name of the report attribute that carries the record (xdist serialises it as is).
REPORT_ATTR = "kernelfix"


@dataclass(frozen=True)
class Failure:
    """A kernel-marked test that failed in its call phase.

    ``hashes`` are sha256 digests of the project files involved, taken when the test
    ran, so that ``--kernelfix-apply`` can refuse to overwrite a file edited since.
    ``crashed``: the test took its xdist worker down (nothing was recorded; healing
    reruns it alone first); ``marked``: it carries the ``kernel`` marker;
    ``duration``: seconds its call phase took (what makes a representative cheap).
    """

    nodeid: str
    test_path: str
    error: ErrorInfo
    longrepr: str
    launches: tuple[KernelLaunch, ...] = ()
    hashes: tuple[tuple[str, str], ...] = ()
    crashed: bool = False
    marked: bool = False
    duration: float = 0.0


@dataclass(frozen=True)
class PassedTest:
    """A test that passed, with the kernels it launched (the regression set)."""

    nodeid: str
    launches: tuple[KernelLaunch, ...] = ()


#: The error type of a test that crashed its worker, before it is rerun alone.
WORKER_CRASH = "WorkerCrash"


def crash_failure(nodeid: str, root: Path, message: str, *, marked: bool) -> Failure:
    """A test that crashed its xdist worker: a failure to heal, with nothing recorded yet."""
    test_path = str(root / nodeid.split("::")[0])
    return Failure(nodeid, test_path, ErrorInfo(WORKER_CRASH, message), message,
                   crashed=True, marked=marked)


def involved_hashes(error: ErrorInfo, launches: Iterable[KernelLaunch], root: Path) -> (
    tuple[tuple[str, str], ...]
):
    """(path, sha256) of the project files a failure involves (its traceback, its
    kernels and their launch sites), for apply mode."""
    launches = tuple(launches)
    paths = {frame.path for frame in error.frames} | {launch.file for launch in launches}
    paths |= {site[0] for launch in launches for site in launch.sites}
    return tuple(sorted(
        (path, file_digest(path))
        for path in paths
        if path and is_within(path, root) and os.path.isfile(path)
    ))


@dataclass(frozen=True)
class Selection:
    """Which failing tests are healed (``kernelfix_select``): those marked ``kernel``,
    those that launched a Triton kernel of the project (or raised in a project module
    that defines one, on the way to its launch: :func:`reached_project_kernel`), or
    those whose nodeid matches a glob. A test is healed when any of the chosen rules
    selects it."""

    marker: bool = True
    launched: bool = False
    globs: tuple[str, ...] = ()

    @classmethod
    def of(cls, items: Sequence[str]) -> Selection:
        return cls("kernel" in items, "launched" in items,
                   tuple(item for item in items if item not in SELECT_WORDS))

    def matches(self, nodeid: str) -> bool:
        return any(fnmatch.fnmatchcase(nodeid, glob) for glob in self.globs)

    def selects(self, nodeid: str, marked: bool, launches: Iterable[KernelLaunch],
                project: Project, frames: Iterable[Frame] = ()) -> bool:
        if (self.marker and marked) or self.matches(nodeid):
            return True
        return self.launched and reached_project_kernel(launches, frames, project)

    def why_not(self, nodeid: str, marked: bool, launches: Iterable[KernelLaunch],
                project: Project, frames: Iterable[Frame] = ()) -> str:
        """Why a failing test is not healed (every chosen rule it fails); "": it is."""
        launches = tuple(launches)
        if self.selects(nodeid, marked, launches, project, frames):
            return ""
        rules = (("not marked kernel", self.marker),
                 ("launched no project kernel", self.launched),
                 ("matched no glob", bool(self.globs)))
        return " and ".join(reason for reason, chosen in rules if chosen)

    def may_select_crash(self, nodeid: str, marked: bool) -> bool:
        """Before a crashed test is rerun, what it launched is unknown: with ``launched``
        it is kept, and checked again once the rerun has recorded its launches."""
        return self.launched or (self.marker and marked) or self.matches(nodeid)


def launched_project_kernel(launches: Iterable[KernelLaunch], project: Project) -> bool:
    """Whether a test launched a Triton kernel defined in the project (not a library's)."""
    return any(project.contains(launch.file) and not project.in_environment(launch.file)
               for launch in launches)


def reached_project_kernel(launches: Iterable[KernelLaunch], frames: Iterable[Frame],
                           project: Project) -> bool:
    """What ``launched`` selects: the test launched a Triton kernel of the project, or its
    error was raised in a project source module that defines one (a wrapper or a
    launch-sizing helper that failed before the launch: a root cause shared by every
    kernel that calls it, which no launch records)."""
    return launched_project_kernel(launches, project) or any(
        project.is_source(frame.path) and defines_kernel(frame.path) for frame in frames)


def defines_kernel(path: str) -> bool:
    """Whether the Python file ``path`` defines a Triton kernel
    (:func:`pytest_kernelfix.kernels.defines_kernel`; read once per version of the file)."""
    try:
        stat = os.stat(path)
    except OSError:
        return False
    return _defines_kernel(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _defines_kernel(path: str, mtime_ns: int, size: int) -> bool:
    try:
        return kernels.defines_kernel(Path(path).read_bytes())
    except OSError:
        return False


@dataclass(frozen=True)
class Unselected:
    """A failing test the selection left out: ``why`` (:meth:`Selection.why_not`), and
    whether it launched a kernel of the project or failed on the way to one
    (``launched`` would select it: :func:`reached_project_kernel`)."""

    nodeid: str
    why: str
    launched: bool = False


def file_digest(path: str | os.PathLike[str]) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


@dataclass(frozen=True)
class CaptureRecord:
    """What one call phase leaves on its report (``report.kernelfix``): whether the test is
    marked ``kernel``, its file, the kernels it launched and, for a failure, the error and
    the (path, sha256) of the project files it involves."""

    kernel: bool
    test_path: str
    launches: tuple[KernelLaunch, ...] = ()
    error: ErrorInfo | None = None
    hashes: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON primitives, which xdist carries as they are (a pass has no error)."""
        record: dict[str, Any] = {
            "kernel": self.kernel,
            "test_path": self.test_path,
            "launches": [launch.to_json() for launch in self.launches],
        }
        if self.error is not None:
            record["error"] = self.error.to_json()
            record["hashes"] = [list(pair) for pair in self.hashes]
        return record


def report_record(
    *,
    kernel: bool,
    test_path: str,
    launches: tuple[KernelLaunch, ...],
    error: ErrorInfo | None,
    root: Path,
) -> dict[str, Any]:
    """The JSON-primitive record of one call phase, for ``report.kernelfix``."""
    hashes = involved_hashes(error, launches, root) if error is not None else ()
    return CaptureRecord(kernel, test_path, launches, error, hashes).to_json()


def read_record(nodeid: str, record: Any, longrepr: str) -> Failure | PassedTest:
    """Rebuild a :class:`Failure` (a record with an error) or a :class:`PassedTest`; a
    record that is not a :class:`CaptureRecord` is a
    :class:`~pytest_kernelfix.fields.FieldError` naming the bad field."""
    captured = read(CaptureRecord, record)
    if captured.error is None:
        return PassedTest(nodeid, captured.launches)
    return Failure(nodeid, captured.test_path, captured.error, longrepr, captured.launches,
                   captured.hashes, marked=captured.kernel)
