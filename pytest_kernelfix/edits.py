"""Deprecated alias of :mod:`pytest_kernelfix.engine.parse`, kept for one release.

Import from ``pytest_kernelfix.engine.parse`` (or ``pytest_kernelfix.engine``) instead.
"""

from __future__ import annotations

from pytest_kernelfix.engine.parse import *  # noqa: F403
