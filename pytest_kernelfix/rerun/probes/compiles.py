"""Counting Triton compiles in a GPU rerun child.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from typing import Any

from pytest_kernelfix.rerun.report import CompileCounts


class CompileCounter:
    """Counts Triton compiles on a GPU: how many came from the cache directory the
    session's reruns share (``TRITON_CACHE_DIR``), how many were compiled anew.

    Uses Triton's compilation listener (``knobs.compilation.listener``), chained to any
    listener already set; counts nothing where this Triton has none.
    """

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.installed = False
        self._previous: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("cache_hit"):
            self.hits += 1
        else:
            self.misses += 1
        if self._previous is not None:
            self._previous(*args, **kwargs)

    def install(self) -> None:
        try:
            from triton import knobs

            self._previous = knobs.compilation.listener
            knobs.compilation.listener = self
        except Exception:  # an older Triton, or none: nothing to count
            return
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        from triton import knobs

        knobs.compilation.listener = self._previous
        self.installed = False

    def counts(self) -> CompileCounts:
        return CompileCounts(self.hits, self.misses)
