"""Deprecated alias of :mod:`pytest_kernelfix.engine.splice`, kept for one release.

Import from ``pytest_kernelfix.engine.splice`` (or ``pytest_kernelfix.engine``) instead.
"""

from __future__ import annotations

from pytest_kernelfix.engine.splice import *  # noqa: F403
