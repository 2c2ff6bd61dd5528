"""The sandbox files one bug's verifier writes, and the files it must find untouched.

Candidates are written into a sandbox copy shared by the bugs of a chain; every file a
candidate wrote is put back once the bug ends. Test modules, conftest files and data
files are protected: the original tree is the reference (a snapshot of the shared
sandbox could already hold an earlier candidate's damage), and a test that writes through
a hardlinked data file is caught too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_kernelfix.rerun.sandbox import Sandbox


class Workspace:
    """Writes candidates into ``sandbox`` and tells when protected files changed."""

    def __init__(self, sandbox: Sandbox, protected: Sequence[str] = ()) -> None:
        self.sandbox = sandbox
        self.protected = tuple(protected)
        self.written: dict[str, str] = {}

    def protect(self, more: Sequence[str]) -> None:
        """Protect these files too (the test files of failures that arrived later)."""
        self.protected = tuple(dict.fromkeys((*self.protected, *more)))

    def write(self, files: Mapping[str, str]) -> None:
        for path, text in files.items():
            if self.written.get(path) != text:
                self.sandbox.write(path, text)
                self.written[path] = text

    def restore(self) -> None:
        """Put the original bytes back for every file written here."""
        for path in self.written:
            self.sandbox.reset(path)
        self.written = {}

    def tampered(self) -> list[str]:
        """Protected files whose sandbox bytes differ from the original tree's (or are
        gone), and written-through links."""
        changed = []
        for path in self.protected:
            try:
                same = (self.sandbox.path(path).read_bytes()
                        == (self.sandbox.source / path).read_bytes())
            except OSError:
                same = False
            if not same:
                changed.append(path)
        return changed + list(self.sandbox.touched_links())

    def undo(self, paths: Sequence[str]) -> None:
        """Put protected files back after a rerun changed them (later rounds and bugs
        share the sandbox)."""
        for path in paths:
            self.sandbox.reset(path)
