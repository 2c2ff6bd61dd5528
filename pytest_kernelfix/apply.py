"""Deprecated alias of :mod:`pytest_kernelfix.engine.splice`, kept for one release.

Import from ``pytest_kernelfix.engine`` (or its submodules) instead.
"""

from __future__ import annotations

from pytest_kernelfix.engine.diff import unified_diff
from pytest_kernelfix.engine.indent import Style
from pytest_kernelfix.engine.match import (
    LEVELS,
    Ambiguous,
    Match,
    NoMatch,
    Query,
    find_all,
    find_match,
    is_elision,
    line_range,
    line_span,
    text_view,
)
from pytest_kernelfix.engine.parse import Modification, ParsedResponse
from pytest_kernelfix.engine.splice import DiffResult, apply_modifications, clear_caches

__all__ = [
    "LEVELS",
    "Ambiguous",
    "DiffResult",
    "Match",
    "Modification",
    "NoMatch",
    "ParsedResponse",
    "Query",
    "Style",
    "apply_modifications",
    "clear_caches",
    "find_all",
    "find_match",
    "is_elision",
    "line_range",
    "line_span",
    "text_view",
    "unified_diff",
]
