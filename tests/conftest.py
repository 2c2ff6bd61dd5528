"""Shared test set-up.

Kernels imported by tests in this process run on the Triton interpreter: the variable
must be set before any ``@triton.jit`` function is decorated.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
