"""Static checks on every candidate before it is run: a heal that cannot lie.

Model output is untrusted input. A candidate is rejected here, with a reason that goes
into the report and back to the model, when it does something no fix of a kernel
does. Checks that need a run (kernel bypass, regressions, crashes) live in verify.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_kernelfix.edits import Modification
from pytest_kernelfix.heal import Guard
from pytest_kernelfix.redact import MARKER


def writes_redacted(modifications: Sequence[Modification]) -> str:
    """Secrets are shown to the model as a marker; an edit must not write it back."""
    for index, modification in enumerate(modifications, start=1):
        if MARKER in modification.new_string:
            return (f"edit {index} writes the redaction marker {MARKER} into the source; "
                    "leave lines holding redacted secrets unchanged")
    return ""


def build_guard() -> Guard:
    """The guard the healing loop applies to every candidate, first reason wins."""

    def guard(
        before: Mapping[str, str], after: Mapping[str, str], modifications: Sequence[Modification]
    ) -> str:
        return writes_redacted(modifications)

    return guard
