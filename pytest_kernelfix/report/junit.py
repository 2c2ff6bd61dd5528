"""The heal in the JUnit XML report: properties on every failing kernel test's testcase.

Healing ends after the tests ran, so nothing set during a test can carry its outcome.
:class:`JUnitProperties` waits for pytest's ``junitxml`` to write ``--junitxml`` at
session end (its hook wrapper resumes after every plain ``pytest_sessionfinish``, the
heal and junitxml's write included), then adds to each testcase of a healed, unhealed
or skipped bug::

    <properties>
      <property name="kernelfix_bug" value="scale_kernel-assertionerror-1a2b3c"/>
      <property name="kernelfix_status" value="healed"/>
      <property name="kernelfix_reason" value="healed in round 1"/>
      <property name="kernelfix_patch" value=".kernelfix/scale_kernel-assertionerror-1a2b3c.patch"/>
    </properties>

``kernelfix_patch`` (relative to the rootdir) is there only when a patch was written.
The file is read back and replaced atomically; testcases are matched by junitxml's own
``classname`` / ``name`` for the node id, so it works the same under ``pytest -n``
(reports reach the controller, which writes the file). Properties inside a testcase are
what ``record_property`` writes too; the strict xunit2 schema does not list them, and
consumers that validate against it ignore or reject them alike.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_kernelfix.atomic import replace_file

if TYPE_CHECKING:  # loaded at configure time: the report's imports wait for a report
    from pytest_kernelfix.report.model import SessionReport
    from pytest_kernelfix.report.publish import Published

#: Characters XML 1.0 cannot hold, even escaped.
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

Names = tuple[str, str]


def junit_names(nodeid: str, prefix: str = "") -> Names:
    """The ``classname`` and ``name`` junitxml writes for ``nodeid``."""
    try:
        from _pytest.junitxml import mangle_test_address

        names = list(mangle_test_address(nodeid))
    except (ImportError, TypeError, ValueError):  # its rule, should the helper move
        path, bracket, params = nodeid.partition("[")
        names = path.split("::")
        names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
        names[-1] += bracket + params
    classnames = ([prefix] if prefix else []) + names[:-1]
    return ".".join(classnames), _NOT_XML.sub("?", names[-1])


def bug_properties(report: SessionReport) -> dict[str, list[tuple[str, str]]]:
    """Node id -> the properties of its bug; ``kernelfix_patch`` once per patch that heals
    it (its own, or those of the bugs whose patch heals it too)."""
    from pytest_kernelfix.report.model import healing_patches

    out: dict[str, list[tuple[str, str]]] = {}
    for bug in report.bugs:
        properties = [
            ("kernelfix_bug", bug.group.id),
            ("kernelfix_status", bug.result.status),
            ("kernelfix_reason", bug.result.reason),
        ]
        for name in healing_patches(bug, report):
            patch = os.path.relpath(report.report_dir / name, report.rootdir)
            properties.append(("kernelfix_patch", Path(patch).as_posix()))
        for nodeid in bug.group.nodeids:
            out[nodeid] = properties
    return out


def add_properties(path: Path, wanted: Mapping[Names, list[tuple[str, str]]]) -> int:
    """Add ``wanted`` to the matching testcases of the JUnit file; how many got them."""
    tree = ET.parse(path)
    count = 0
    for testcase in tree.getroot().iter("testcase"):
        extra = wanted.get((testcase.get("classname", ""), testcase.get("name", "")))
        if not extra:
            continue
        holder = testcase.find("properties")
        if holder is None:
            holder = ET.Element("properties")
            testcase.insert(0, holder)  # JUnit schemas want properties first
        for name, value in extra:
            ET.SubElement(holder, "property", name=name, value=_NOT_XML.sub("?", value))
        count += 1
    text = '<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(tree.getroot(),
                                                                  encoding="unicode")
    replace_file(path, text.encode("utf-8"))
    return count


class JUnitProperties:
    """A publishing sink and a pytest plugin, registered beside the controller when
    ``--junitxml`` is given: :meth:`publish` keeps the report, and the file is changed
    once junitxml has written it; ``note`` hears what went wrong then."""

    name = "the JUnit properties"
    required = False

    def __init__(self, xmlpath: str, prefix: str, note: Callable[[str], None]) -> None:
        # junitxml resolves the path at configure time, against the invocation directory.
        self.path = Path(os.path.normpath(os.path.abspath(
            os.path.expanduser(os.path.expandvars(xmlpath)))))
        self.prefix = prefix
        self.note = note
        self.report: SessionReport | None = None

    def publish(self, report: SessionReport) -> Published:
        from pytest_kernelfix.report.publish import Published

        self.report = report
        return Published()

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self) -> Generator[None, object, object]:
        # trylast: inside the terminal reporter's wrapper, so a note still reaches the summary
        result = yield
        report = self.report
        if report is not None and report.bugs:
            wanted = {junit_names(nodeid, self.prefix): properties
                      for nodeid, properties in bug_properties(report).items()}
            try:
                add_properties(self.path, wanted)
            except Exception as error:  # a report left as junitxml wrote it, never a crash
                self.note(f"the JUnit report {self.path} was left without kernelfix "
                          f"properties: {type(error).__name__}: {error}")
        return result
