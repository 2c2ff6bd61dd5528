"""The edit engine: read a model's answer, find each quote, splice, diff.

Pure functions over strings, knowing nothing of pytest, models or files on disk:

- :mod:`~pytest_kernelfix.engine.parse`: ``Modification`` and the answer parser;
- :mod:`~pytest_kernelfix.engine.match`: where an ``old_string`` is, level by level;
- :mod:`~pytest_kernelfix.engine.splice`: apply a list of modifications to one text, with
  :mod:`~pytest_kernelfix.engine.replacement` (what lands on a match),
  :mod:`~pytest_kernelfix.engine.indent` (re-indentation) and
  :mod:`~pytest_kernelfix.engine.chunks` (the Python syntax check);
- :mod:`~pytest_kernelfix.engine.diff`: unified diffs of one file or several;
- :mod:`~pytest_kernelfix.engine.files`: which file each edit targets.

The names below are loaded on first use, so importing one submodule does not import
the matcher's numpy and rapidfuzz.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Modification": "parse",
    "ParsedResponse": "parse",
    "ParseError": "parse",
    "parse_modifications": "parse",
    "Match": "match",
    "NoMatch": "match",
    "Ambiguous": "match",
    "find_match": "match",
    "DiffResult": "splice",
    "apply_modifications": "splice",
    "unified_diff": "diff",
    "EditOutcome": "files",
    "apply_proposal": "files",
    "cumulative_diff": "diff",
    "resolve_file": "files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
