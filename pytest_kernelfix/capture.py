"""What a test run leaves for healing: failed kernel tests and the tests that passed.

Where tests run (a plain session or an xdist worker) :func:`report_record` turns one
call phase into JSON primitives attached to the report; where reports are collected
(the plain session or the xdist controller) :func:`read_record` turns it back into
:class:`Failure` or :class:`PassedTest`. Nothing here holds a live object.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelfix.failure import ErrorInfo
from pytest_kernelfix.launches import KernelLaunch
from pytest_kernelfix.project import is_within

#: Name of the report attribute that carries the record (xdist serialises it as is).
REPORT_ATTR = "kernelfix"


@dataclass(frozen=True)
class Failure:
    """A kernel-marked test that failed in its call phase.

    ``hashes`` are sha256 digests of the project files involved, taken when the test
    ran, so that ``--kernelfix-apply`` can refuse to overwrite a file edited since.
    """

    nodeid: str
    test_path: str
    error: ErrorInfo
    longrepr: str
    launches: tuple[KernelLaunch, ...] = ()
    hashes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PassedTest:
    """A test that passed, with the kernels it launched (the regression set)."""

    nodeid: str
    launches: tuple[KernelLaunch, ...] = ()


def file_digest(path: str | os.PathLike[str]) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def report_record(
    *,
    kernel: bool,
    test_path: str,
    launches: tuple[KernelLaunch, ...],
    error: ErrorInfo | None,
    root: Path,
) -> dict[str, Any]:
    """The JSON-primitive record of one call phase, for ``report.kernelfix``."""
    record: dict[str, Any] = {
        "kernel": kernel,
        "test_path": test_path,
        "launches": [launch.to_json() for launch in launches],
    }
    if error is not None:
        record["error"] = error.to_json()
        involved = {frame.path for frame in error.frames} | {launch.file for launch in launches}
        record["hashes"] = sorted(
            (path, file_digest(path))
            for path in involved
            if path and is_within(path, root) and os.path.isfile(path)
        )
    return record


def read_record(nodeid: str, record: dict[str, Any], longrepr: str) -> Failure | PassedTest:
    """Rebuild a :class:`Failure` (a record with an error) or a :class:`PassedTest`."""
    launches = tuple(KernelLaunch.from_json(item) for item in record.get("launches", ()))
    if "error" not in record:
        return PassedTest(nodeid, launches)
    return Failure(
        nodeid=nodeid,
        test_path=str(record.get("test_path", "")),
        error=ErrorInfo.from_json(record["error"]),
        longrepr=longrepr,
        launches=launches,
        hashes=tuple((str(p), str(h)) for p, h in record.get("hashes", ())),
    )
