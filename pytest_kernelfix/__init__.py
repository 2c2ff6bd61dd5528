"""pytest-kernelfix: heal failing Triton kernel tests with verified patches.

The package is imported by every pytest run in an environment where it is installed
(it is a ``pytest11`` entry point), so this module and :mod:`pytest_kernelfix.plugin`
import nothing heavy: no torch, triton or litellm.
"""

from __future__ import annotations

__version__ = "0.1.0"
