"""Deprecated alias of :mod:`pytest_kernelfix.engine.match`, kept for one release.

Import from ``pytest_kernelfix.engine.match`` (or ``pytest_kernelfix.engine``) instead.
"""

from __future__ import annotations

from pytest_kernelfix.engine.match import *  # noqa: F403
