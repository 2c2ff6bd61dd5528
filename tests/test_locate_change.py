"""The change since a base as pure text: hunks, reverts, what a prompt shows of it, the
definitions it touched ranked first, and when a patch is only a revert of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.locate.change import (
    MAX_PINNED_TOUCHED,
    REGRESSION,
    Change,
    FileChange,
    Hunk,
    Regression,
    Trial,
    change_view,
    file_hunks,
    reverts_only,
    touched_definitions,
    with_change,
)
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.locate.reach import TIER_FIRST, TIER_KERNEL, Located
from pytest_kernelfix.project import Project

BASE = "".join(f"line {i}\n" for i in range(1, 31))


def edited(text: str, **lines: str) -> str:
    """``text`` with line N replaced (``l7="new"``; "" removes it, a ``\\n`` adds lines)."""
    rows = text.splitlines(keepends=True)
    for key, value in sorted(lines.items(), key=lambda item: -int(item[0][1:])):
        number = int(key[1:])
        rows[number - 1:number] = [value] if value else []
    return "".join(rows)


def test_hunks_are_runs_of_changes_close_changes_merged() -> None:
    current = edited(BASE, l3="three\n", l5="five\n", l20="twenty\nmore\n", l28="")
    hunks = file_hunks("m.py", BASE, current)
    assert [(h.start, h.end, h.base_start, h.base_end) for h in hunks] == [
        (3, 5, 3, 5), (20, 21, 20, 20), (29, 28, 28, 28)]
    assert hunks[0].lines == ("three", "line 4", "five")
    assert hunks[2].span == "before 29" and hunks[2].lines == () and hunks[2].line == 28
    assert [h.label for h in hunks[:2]] == ["m.py:3-5", "m.py:20-21"]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_reverting_a_subset_puts_back_just_those_lines(newline: str) -> None:
    base = BASE.replace("\n", newline)
    current = edited(base, l3=f"three{newline}", l20=f"twenty{newline}more{newline}", l28="")
    change = Change("HEAD", (FileChange("m.py", base, current),))
    first, second, third = change.hunks
    assert change.reverted([]) == {}
    assert change.reverted([second])["m.py"] == edited(base, l3=f"three{newline}", l28="")
    assert change.reverted([first, third])["m.py"] == edited(
        base, l20=f"twenty{newline}more{newline}")
    assert change.reverted(change.hunks)["m.py"] == base


def test_added_and_removed_files_revert_to_absent_and_back() -> None:
    added = FileChange("new.py", None, "x = 1\n")
    removed = FileChange("old.py", "y = 2\n", None)
    change = Change("HEAD", (added, removed))
    assert change.reverted(added.hunks) == {"new.py": None}
    assert change.reverted(removed.hunks) == {"old.py": "y = 2\n"}


def test_every_hunk_now_comes_before_any_base_text_and_the_bug_s_files_lead() -> None:
    """The current lines (what a fix quotes) of every hunk fit before the base's lines
    take the room left; the bug's own file leads, those left out are named, and tests are
    named, never shown."""
    long_base = "".join(f"an old line of the base, number {i}\n" for i in range(40))
    files = tuple(FileChange(f"pkg/m{i}.py", long_base + BASE,
                             long_base.replace("line of", "LINE OF") + BASE)
                  for i in range(3))
    test = FileChange("tests/test_m.py", "a\n", "b\n", test=True)
    change = Change("main", (*files, test))
    view = change_view(change, first=["pkg/m2.py"], limit=4_000)
    assert view.culprit == "" and view.tests == ("tests/test_m.py",)
    assert view.diff.startswith("pkg/m2.py, lines 1-40, now (with the lines around):")
    now = "".join(f"an old LINE OF the base, number {i}\n" for i in range(40))
    assert view.diff.count(now) == 2  # m2 and m0 whole, then the base's lines of m2 cut
    assert view.diff.index("pkg/m0.py, lines 1-40, now") > view.diff.index(
        "more lines of the base left out]")
    assert "before the change: 40 lines (left out: no room)" in view.diff
    assert view.diff.endswith("[... 1 more changed hunk not shown: pkg/m1.py:1-40]")
    assert "test_m" not in view.diff and len(view.diff) < 4_000


MODULE = '''\
import triton


def helper(n):
    n = n * 2
    return n + 1


class Holder:
    def method(self):
        value = 1
        return value


def other():
    return 2
'''


def test_the_touched_definitions_are_the_innermost_around_each_hunk() -> None:
    current = MODULE.replace("value = 1", "value = 2").replace("return 2", "return 3")
    hunks = file_hunks("m.py", MODULE, current)
    assert touched_definitions(hunks, current) == ("Holder.method", "other")
    removed = MODULE.replace("    n = n * 2\n", "")
    assert touched_definitions(file_hunks("m.py", MODULE, removed), removed) == ("helper",)


def _group(root: Path, located: tuple[Located, ...]) -> BugGroup:
    failure = Failure("tests/test_k.py::test_k", str(root / "tests" / "test_k.py"),
                      ErrorInfo("AssertionError", "not close"), "longrepr")
    return BugGroup("k-assertionerror-abc123", "k", "sig", ("kernels/k.py",), (failure,),
                    located)


def test_with_change_makes_changed_files_editable_and_ranks_what_it_touched_first(
    tmp_path: Path,
) -> None:
    """The culprit's definition above the kernel, the kernel pinned below it; the other
    touched ones pinned just below the kernel, a few at most; reach's ranking otherwise
    kept."""
    names = [f"f{i}" for i in range(MAX_PINNED_TOUCHED + 2)]
    module = "".join(f"def {name}():\n    return {i}\n\n\n" for i, name in enumerate(names))
    current = module
    for i in range(len(names)):
        current = current.replace(f"    return {i}\n", f"    return {i + 10}\n")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("import triton\n")
    (tmp_path / "kernels" / "util.py").write_text(current)
    (tmp_path / "tests").mkdir()
    change = Change("main", (FileChange("kernels/util.py", module, current),
                             FileChange("tests/test_k.py", "a\n", "b\n", test=True)))
    located = (Located("kernels/k.py", "k", 10.0, "launched", jit=True, tier=TIER_KERNEL),
               Located("kernels/k.py", "wrapper", 7.0, "launch site", tier=TIER_FIRST))
    project = Project(tmp_path)
    group = with_change(_group(tmp_path, located), change, project)
    assert group.editable == ("kernels/k.py", "kernels/util.py")
    ranked = {item.qualname: item for item in group.located}
    assert ranked["k"].score == 10.0
    order = [item.qualname for item in group.located]
    # reach's first tier and the kernel, then the touched ones: a few pinned, then the rest
    assert order == ["wrapper", "k", *names]
    pinned = [name for name in names if ranked[name].pinned]
    assert pinned == names[:MAX_PINNED_TOUCHED]
    culprit = change.source_hunks[-1]
    group = with_change(_group(tmp_path, located), change, project, [culprit])
    ranked = {item.qualname: item for item in group.located}
    top = ranked[names[-1]]
    assert group.located[0] == top and top.pinned and "revert" in top.why
    assert ranked["k"].pinned and ranked["k"].score == 10.0  # the kernel gives way to it


def _regression(hunks: tuple[Hunk, ...]) -> Regression:
    return Regression("main (abc)", REGRESSION, "tests/test_k.py::test_k", hunks,
                      (Trial(("m.py:3",), True),), 4)


def test_the_view_shows_the_culprit_beside_the_base_and_says_how_it_was_found() -> None:
    current = edited(BASE, l3="three\n", l20="twenty\n", l27="twenty-seven\n")
    change = Change("main (abc)", (FileChange("m.py", BASE, current),))
    view = change_view(change, _regression(change.hunks[1:2]))
    assert view.culprit.startswith("tests/test_k.py::test_k fails on the current code")
    assert ("m.py, line 20, now (with the lines around):\n```python\nline 19\ntwenty\n"
            "line 21\n```\nbefore the change:\n```python\nline 20\n```") in view.culprit
    # the rest: the hunk nearest the culprit first
    assert view.diff.index("m.py, line 27, now") < view.diff.index("m.py, line 3, now")
    assert "three" not in view.culprit and "\nthree\n" in view.diff
    removed = Change("main", (FileChange("m.py", BASE, edited(BASE, l10="")),))
    text = change_view(removed, _regression(removed.hunks)).culprit
    assert "removed lines, before line 10, now (with the lines around):\n```python\n" \
        "line 9\nline 11\n```\nbefore the change:\n```python\nline 10\n```" in text
    assert "1 reruns" not in view.culprit and view.size > len(view.diff) + len(view.culprit)
    summary = _regression(change.hunks[1:2]).summary
    assert summary.startswith("regression since main (abc): line 20 of m.py introduced it")
    assert "(1 rerun over 4 changed hunks)" in summary


def test_a_patch_is_a_revert_only_when_it_puts_back_lines_of_the_change() -> None:
    current = edited(BASE, l3="three\n", l20="twenty\n")
    change = Change("main", (FileChange("m.py", BASE, current),))
    assert reverts_only(change, {"m.py": current}, {"m.py": edited(current, l3="line 3\n")})
    assert reverts_only(change, {"m.py": current}, {"m.py": BASE})
    assert not reverts_only(change, {"m.py": current}, {"m.py": edited(current, l3="3\n")})
    assert not reverts_only(change, {"m.py": current}, {"m.py": edited(current, l9="nine\n")})
    assert not reverts_only(change, {"other.py": "a\n"}, {"other.py": "b\n"})
