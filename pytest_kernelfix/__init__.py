"""pytest-kernelfix: heal failing Triton kernel tests with verified patches.

The package is imported by every pytest run in an environment where it is installed
(it is a ``pytest11`` entry point), so this module and :mod:`pytest_kernelfix.plugin`
import nothing heavy: no torch, triton or litellm. The names a hook author needs are
loaded on first use::

    from pytest_kernelfix import Modification, Proposal, ProposalRequest

PYTEST_DONT_REWRITE: the warm rerun server imports the package before pytest starts in
its forked children (nothing here asserts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Modification": "pytest_kernelfix.engine.parse",
    "Proposal": "pytest_kernelfix.fixers.base",
    "ProposalRequest": "pytest_kernelfix.fixers.base",
}

__all__ = ["Modification", "Proposal", "ProposalRequest", "__version__"]

if TYPE_CHECKING:
    from pytest_kernelfix.engine.parse import Modification
    from pytest_kernelfix.fixers.base import Proposal, ProposalRequest


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
