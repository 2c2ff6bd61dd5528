"""Apply one proposal to several files: which file each edit targets, then splice.

A model names files relative to some other directory, or not at all; an edit that names
no file goes to the only file, or to the one file it matches. Each file's edits then go
through :func:`~pytest_kernelfix.engine.splice.apply_modifications` in answer order.
Failed edits are reported per edit, never fatal to the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from pytest_kernelfix.engine.diff import cumulative_diff as cumulative_diff  # its old home
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.engine.splice import apply_modifications


@dataclass(frozen=True)
class EditOutcome:
    """Where one proposed edit went: its file and match level, or why it failed."""

    file: str
    level: str
    error: str = ""


def _normalise(name: str) -> str:
    text = name.strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    return text


def resolve_file(name: str, editable: Sequence[str]) -> tuple[str, str]:
    """Map the ``file`` a model named onto an editable path: ``(path, "")`` or ``("", why)``.

    Models write paths relative to some other directory (``project/kernels/x.py``) or
    just the file name; a unique suffix match is accepted, anything else is refused.
    """
    wanted = _normalise(name)
    if wanted in editable:
        return wanted, ""
    if wanted.startswith("/") or ".." in PurePosixPath(wanted).parts:
        return "", f"file {name!r} is outside the editable set (absolute or '..' path)"
    for prefix in ("a/", "b/"):
        if wanted.startswith(prefix) and wanted[len(prefix):] in editable:
            return wanted[len(prefix):], ""
    suffix = [path for path in editable if path.endswith("/" + wanted) or wanted.endswith(
        "/" + path)]
    if len(suffix) == 1:
        return suffix[0], ""
    return "", (
        f"file {name!r} is not editable; edits may only target: {', '.join(editable)}"
    )


def locate(modification: Modification, files: Mapping[str, str]) -> tuple[str, str]:
    """Pick the file for an edit that names none: the only file, or the one it matches."""
    if len(files) == 1:
        return next(iter(files)), ""
    matching = [
        path
        for path, text in files.items()
        if apply_modifications(text, [modification], path=path).applied
    ]
    if len(matching) == 1:
        return matching[0], ""
    if matching:
        return "", (
            f"old_string matches in several files ({', '.join(matching)}); "
            'name the target with "file"'
        )
    return "", ""  # let the matcher of the first file explain the miss


@dataclass(frozen=True)
class Application:
    """The result of applying one proposal to the current files."""

    files: Mapping[str, str]
    edits: tuple[EditOutcome, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]


def apply_proposal(
    modifications: Sequence[Modification], files: Mapping[str, str]
) -> Application:
    """Apply every edit to its file, in order; failed edits are reported, not fatal."""
    editable = tuple(files)
    outcomes: dict[int, EditOutcome] = {}
    by_file: dict[str, list[int]] = {}
    for index, modification in enumerate(modifications):
        if modification.file:
            path, why = resolve_file(modification.file, editable)
        else:
            path, why = locate(modification, files)
            path = path or ("" if why else editable[0])
        if why:
            outcomes[index] = EditOutcome("", "none", f"Edit {index + 1}: {why}")
        else:
            by_file.setdefault(path, []).append(index)
    updated = dict(files)
    warnings: list[str] = []
    for path, indices in by_file.items():
        result = apply_modifications(
            updated[path], [modifications[i] for i in indices], path=path,
            labels=[f"Edit {i + 1} ({path})" for i in indices],
        )
        updated[path] = result.code
        warnings.extend(f"{path}: {warning}" for warning in result.warnings)
        messages = iter(result.errors)  # one per failed modification, in order
        for position, index in enumerate(indices):
            level = result.levels[position] if position < len(result.levels) else "none"
            error = next(messages, "did not apply") if level == "none" else ""
            outcomes[index] = EditOutcome(path, level, error)
    ordered = tuple(outcomes[i] for i in range(len(modifications)))
    errors = tuple(outcome.error for outcome in ordered if outcome.level == "none")
    return Application(updated, ordered, errors, tuple(warnings))
