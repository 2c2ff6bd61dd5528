"""The screen every candidate passes before it runs: what it may target, hold and do.

Model output is untrusted input, and the rerun executes it with the user's rights. A
candidate is rejected here, with a reason that goes into the report and back to the
model, when running it would be unsafe or when it aims at what a fix must never touch:
it targets a test, a conftest or a path outside the editable set, writes binary junk or
an oversized file, skips or xfails the test, patches a library (a run-time change of
code outside the editable set), or reaches for files (logging file handlers included),
processes, the environment, dynamic code or the call stack.

The code checks compare the candidate's :func:`~pytest_kernelfix.heal.analysis.facts`
with those of the text it was made from and look only at what the candidate *adds*:
code the project already had is never held against a fix. A candidate the screen lets
through carries the notes on its shape (:func:`~pytest_kernelfix.heal.analysis.shape_notes`)
on its :class:`Screening`.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath

from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.heal.analysis import Facts, added, changed_modules, facts, shape_notes
from pytest_kernelfix.heal.outcomes import Candidate, Guard, Screening
from pytest_kernelfix.project import MAX_EDITABLE_BYTES, Project
from pytest_kernelfix.redact import MARKER

Check = Callable[[Mapping[str, str], Mapping[str, str], Sequence[Modification]], str]

_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")

#: Names a kernel fix never adds: the test framework (skip, xfail, importorskip).
SKIP_NAMES = frozenset({
    "pytest", "_pytest", "unittest", "SkipTest", "skipTest", "importorskip", "xfail", "skipif",
    "testing", "assert_close",
})

#: Names a kernel fix never adds: files, processes, the environment, dynamic code,
#: interpreter internals and process exits.
ESCAPE_NAMES = frozenset({
    "open", "os", "sys", "subprocess", "shutil", "pathlib", "socket", "ctypes", "signal",
    "importlib", "__import__", "exec", "eval", "builtins", "__builtins__", "globals",
    "locals", "vars", "setattr", "delattr", "getattr", "inspect", "gc", "_getframe",
    "__code__", "__globals__", "__subclasses__", "__dict__", "multiprocessing", "threading",
    "atexit", "tempfile", "environ", "exit", "quit", "_exit", "abort", "urllib", "requests",
    "http", "pickle", "marshal", "faulthandler", "resource", "breakpoint", "io", "mmap",
    "posix", "pty", "asyncio", "codecs", "runpy", "zipimport", "CodeType", "FunctionType",
    "cpp_extension", "load_inline", "hub", "__class__", "__bases__", "__mro__", "__loader__",
    "__spec__",
    # logging into files
    "FileHandler", "RotatingFileHandler", "TimedRotatingFileHandler", "WatchedFileHandler",
    "basicConfig", "fileConfig", "dictConfig",
    # the call stack: code that finds out it runs under a test
    "traceback", "extract_stack", "walk_stack", "format_stack", "print_stack",
    "currentframe", "stack_info", "f_back", "f_locals", "f_globals", "f_code", "tb_frame",
    "__traceback__", "gi_frame", "cr_frame",
})

#: Bidirectional overrides ("trojan source") hide code from a reviewer.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_TEXT_CONTROLS = frozenset("\t\n\r\x0c")


# -- what an edit targets --------------------------------------------------------------


def edit_targets(project: Project) -> Check:
    """Refuse a candidate as a whole when any edit names a file outside the editable set.

    Test modules and conftest files get their own reason: they define what a fix must
    achieve. Absolute paths, ``..`` and every other name that does not resolve onto an
    editable file are refused with the list of files that may be edited.
    """

    def check(
        before: Mapping[str, str], after: Mapping[str, str], modifications: Sequence[Modification]
    ) -> str:
        editable = tuple(before)
        allowed = ", ".join(editable) or "no file"
        for index, modification in enumerate(modifications, start=1):
            name = modification.file
            if not name or project.resolve(name, editable)[0]:
                continue
            posix = name.strip().replace("\\", "/")
            if project.is_test_file(posix):
                return (f"test file edit: edit {index} targets {name!r}; test files and "
                        "conftest files are never edited (they define what a fix must "
                        "achieve): fix the kernel source instead")
            if posix.startswith(("/", "~")) or _DRIVE.match(name.strip()):
                return (f"confinement: edit {index} targets the absolute path {name!r}; "
                        f"edits may only target {allowed}")
            if ".." in PurePosixPath(posix).parts:
                return (f"confinement: edit {index} targets {name!r}, which leaves the "
                        f"project through '..'; edits may only target {allowed}")
            return (f"confinement: edit {index} targets {name!r}, which is outside the "
                    f"editable set; edits may only target {allowed}")
        return ""

    return check


# -- what the candidate holds ----------------------------------------------------------


def _non_text(text: str) -> int:
    return sum(
        1 for char in text
        if char in _BIDI
        or (char not in _TEXT_CONTROLS and unicodedata.category(char) in ("Cc", "Cs"))
    )


def text_content(
    before: Mapping[str, str], after: Mapping[str, str], modifications: Sequence[Modification]
) -> str:
    """Changed files stay UTF-8 text of a sane size, without control or bidi characters."""
    for path, text in after.items():
        if before.get(path) == text:
            continue
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return f"non-text: the candidate makes {path} invalid UTF-8 (lone surrogates)"
        if size > MAX_EDITABLE_BYTES:
            return (f"oversized: the candidate makes {path} {size} bytes, over the "
                    f"{MAX_EDITABLE_BYTES // 1024} KiB limit of an editable file")
        added = _non_text(text) - _non_text(before.get(path, ""))
        if added > 0:
            return (f"non-text: the candidate writes {added} control or bidi character(s) "
                    f"into {path}; source files hold text only")
    return ""


def writes_redacted(modifications: Sequence[Modification]) -> str:
    """Secrets are shown to the model as a marker; an edit must not write it back."""
    for index, modification in enumerate(modifications, start=1):
        if MARKER in modification.new_string:
            return (f"edit {index} writes the redaction marker {MARKER} into the source; "
                    "leave lines holding redacted secrets unchanged")
    return ""


# -- what the code does ----------------------------------------------------------------


def _reaches(found: Facts) -> Counter[str]:
    """The watched names the code uses. ``getattr(obj, "name")`` with a public name that
    is not watched (``getattr(props, "multi_processor_count", 1)``) is an attribute read
    with a fallback, no more dynamic than ``obj.name``: it does not count."""
    used = Counter({name: n for name, n in found.names.items() if name in ESCAPE_NAMES})
    used["getattr"] -= sum(n for name, n in found.getattrs.items() if name not in ESCAPE_NAMES)
    return +used


def _code(path: str, old: str, new: str) -> str:
    """The first reason the change from ``old`` to ``new`` in one file is unsafe."""
    after = facts(new)
    before = facts(old)
    if after is None or before is None:
        return ""  # the engine refuses text that does not parse; nothing to compare
    skips = added(before.names, after.names, SKIP_NAMES)
    if skips:
        return (f"skip injection: the candidate adds {', '.join(skips)} to {path}; a fix "
                "makes the test pass, it never skips, xfails or changes the test's checks")
    patches = added(before.patches, after.patches)
    if patches:
        return (f"monkeypatch: the candidate assigns to {', '.join(patches)} in {path}; "
                "patching a library changes code outside the editable files (and what the "
                "test checks), not the kernel")
    escapes = added(_reaches(before), _reaches(after)) + added(before.io, after.io)
    if escapes:
        return (f"unsafe code: the candidate adds {', '.join(escapes)} to {path}; a kernel "
                "fix does not touch files, processes, the environment, the call stack or "
                "interpreter internals, import dynamically or exit")
    return ""


def code_checks(
    before: Mapping[str, str], after: Mapping[str, str], modifications: Sequence[Modification]
) -> str:
    """Skip injection, monkeypatching and unsafe code, per file."""
    for path, old, new in changed_modules(before, after):
        reason = _code(path, old, new)
        if reason:
            return reason
    return ""


def build_guard(project: Project) -> Guard:
    """The screen the healing loop applies to every candidate: the first reason to refuse
    it (checked against the text it was made from), else the notes on its shape (against
    the bug's original text)."""
    checks: tuple[Check, ...] = (
        edit_targets(project),
        text_content,
        lambda before, after, modifications: writes_redacted(modifications),
        code_checks,
    )

    def guard(candidate: Candidate) -> Screening:
        for check in checks:
            reason = check(candidate.base, candidate.files, candidate.modifications)
            if reason:
                return Screening(reason)
        return Screening(notes=shape_notes(candidate.originals, candidate.files))

    return guard
