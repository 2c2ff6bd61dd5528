"""Failing tests that ``kernelfix_select`` left out, as the summary and reports tell them.

They are not healed, and a user who does not know the rule would otherwise see nothing
at all: they are counted with the reason, and the hint names what would select them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from pytest_kernelfix.capture.records import Unselected

#: How many of their nodeids report.json lists.
LISTED = 20


def _plain(text: str) -> str:
    return text


def _code(text: str) -> str:
    return f"`{text}`"


def unselected_sentence(unselected: Sequence[Unselected], select: Sequence[str],
                        code: Callable[[str], str] = _plain) -> str:
    """How many failing tests were left out, why, and the first of them."""
    reasons = "; ".join(f"{count} {why}" if count < len(unselected) else why
                        for why, count in Counter(u.why for u in unselected).items())
    return (f"{len(unselected)} failing test(s) not selected for healing ({reasons}; "
            f"{code('kernelfix_select = ' + ','.join(select))}), first "
            f"{code(unselected[0].nodeid)}")


def select_hint(unselected: Sequence[Unselected], select: Sequence[str],
                code: Callable[[str], str] = _plain) -> str:
    """What would select them: the ``launched`` rule (when some launched a kernel of the
    project), a nodeid glob, or the ``kernel`` marker."""
    ways = []
    launched = sum(u.launched for u in unselected)
    if launched and "launched" not in select:
        chosen = ",".join((*select, "launched"))
        ways.append(f"{code('--kernelfix-select ' + chosen)} (or "
                    f"{code('kernelfix_select = ' + chosen)} in the ini file; {launched} of "
                    "them reached a Triton kernel of the project)")
    glob = unselected[0].nodeid.split("::")[0] + "::*"
    with_glob = "--kernelfix-select '" + ",".join((*select, glob)) + "'"
    ways.append(f"a nodeid glob, as in {code(with_glob)}")
    if "kernel" in select:
        ways.append(f"{code('@pytest.mark.kernel')} on the tests")
    return ", ".join(ways[:-1]) + f" or {ways[-1]}" if len(ways) > 1 else ways[0]


def unselected_lines(unselected: Sequence[Unselected], select: Sequence[str]) -> list[str]:
    """The terminal summary's lines about them (none when there are none)."""
    if not unselected:
        return []
    return [unselected_sentence(unselected, select),
            f"  to heal them: {select_hint(unselected, select)}"]


def unselected_markdown(unselected: Sequence[Unselected], select: Sequence[str],
                        *, only: bool = False) -> list[str]:
    """report.md's paragraph about them (none when there are none); ``only``: they are
    the session's only failures, so nothing was healed, and the paragraph says so first."""
    if not unselected:
        return []
    lead = ("**Nothing was healed: no failing test was selected for healing.** " if only
            else "")
    return ["", f"{lead}Not selected for healing: "
                f"{unselected_sentence(unselected, select, _code)}. "
                f"To heal them: {select_hint(unselected, select, _code)}."]


def unselected_json(unselected: Sequence[Unselected], select: Sequence[str]) -> dict[str, Any]:
    return {
        "count": len(unselected),
        "reasons": dict(Counter(u.why for u in unselected)),
        "launched_project_kernel": sum(u.launched for u in unselected),
        "nodeids": [u.nodeid for u in unselected[:LISTED]],
        "select": list(select),
        "hint": select_hint(unselected, select) if unselected else None,
    }
