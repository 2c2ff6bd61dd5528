"""The healing helper: a process of its own that heals while the tests run.

Healing beside the test run must not touch the test process: its threads would share
the interpreter with the tests (CPython 3.11's AST constructor keeps one recursion
counter per interpreter, so an ``ast.parse`` in a healing thread can make pytest's own
fail with ``SystemError`` mid-run), their warnings would land in a test's
``pytest.warns``, their output in a test's ``capfd``, their locks in a test's
``fork``. So :class:`Helper` starts ``python -c BOOTSTRAP`` as early as it can, in a
session of its own (:func:`early`: before the test process imports torch and triton,
so that the warm rerun server's imports run beside its own); :func:`main` runs there the
:class:`~pytest_kernelfix.session.overlap.Overlap` (and, at the end, the whole healing
session), with its own warm rerun server.

The test process only sends what it already has (each selected failure and each passing
test that launched a kernel, as the records the capture plugin made) and reads back
progress lines (printed by its main thread between test results), calls of the
``pytest_kernelfix_propose`` conftest hook (which only the test process can make: they
run in a thread of it, one at a time, as at the end of a session without overlap) and,
at the end, the session's report, which it publishes. Messages are pickled over two
pipes (:mod:`multiprocessing.connection`).

When the helper cannot start or ends early, the session heals after the run as it does
with ``--kernelfix-overlap off``, and says so.
"""

from __future__ import annotations

import _thread
import contextlib
import itertools
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelfix import redact
from pytest_kernelfix.capture.records import Failure, PassedTest
from pytest_kernelfix.config import Settings, load_settings
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup
from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.session.interrupt import CTRL_C, Cancel, interrupt_name
from pytest_kernelfix.session.start import configured_fixer, rerun_setup, session_project

if TYPE_CHECKING:  # the test process imports this module before torch: nothing heavy
    from pytest_kernelfix.fixers.base import ProposalRequest
    from pytest_kernelfix.locate.base import Changes
    from pytest_kernelfix.report.model import SessionReport
    from pytest_kernelfix.session.inputs import SessionInputs, Stages
    from pytest_kernelfix.session.overlap import Overlap

#: What the helper process runs.
BOOTSTRAP = "from pytest_kernelfix.session.helper import main; main()"
#: Seconds the test process waits for a helper that was asked to stop.
STOP_WAIT = 10.0


@dataclass(frozen=True)
class Start:
    """What the helper needs to heal like the test process would: the settings, the
    project and how reruns are made (its warm server starts from this alone)."""

    settings: Settings
    project: Project
    setup: RerunSetup


@dataclass(frozen=True)
class Session:
    """What is known once the session starts: how many processes run the tests,
    whether a ``pytest_kernelfix_propose`` hook is implemented (the test process answers
    it), and the change since the base (read there, once)."""

    test_processes: int
    hooked: bool
    changes: Changes | None = None


def early(config: Any, namespace: Any, device: str) -> Helper | None:
    """The helper, started before the test process imports torch and triton (from
    ``pytest_load_initial_conftests``) where this process will be the one reports reach;
    None in an xdist worker, or in a pytest started from inside one (the controller
    starts it at the session's start there), or when it cannot start."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    try:
        settings = load_settings(config, namespace)
        start = Start(settings, session_project(config, settings),
                      rerun_setup(config, settings, device))
        return Helper(start)
    except Exception:  # the session's start tries again, and says why
        return None


class RemoteError(Exception):
    """What the other process raised (the hook in the test process, the session in the
    helper), its type's name kept so that messages read as if it were raised here."""


def raised(name: str, text: str) -> Exception:
    """An exception whose type is named ``name``."""
    return type(name, (RemoteError,), {})(text)


# -- the test process's side ------------------------------------------------------------------


class Helper:
    """The test process's end: start the helper, send it records, answer its hook calls,
    print its lines (through ``progress``), get its report."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.ask: Callable[[ProposalRequest], Any] = lambda request: None
        self.progress: Callable[[str], None] = lambda line: None
        self.work = Path(tempfile.mkdtemp(prefix="kernelfix-helper-"))
        self.log = self.work / "helper.log"
        self.report: SessionReport | None = None
        self.error = ""
        self.failure: Exception | None = None  # what stopped the session's healing there
        self.done = threading.Event()
        self._send_lock = threading.Lock()
        ours_in, theirs_out = os.pipe()
        theirs_in, ours_out = os.pipe()
        try:
            with open(self.log, "ab") as sink:
                self.process = subprocess.Popen(
                    [sys.executable, "-c", BOOTSTRAP, str(theirs_in), str(theirs_out)],
                    pass_fds=(theirs_in, theirs_out), stdin=subprocess.DEVNULL,
                    stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                    env=self._env(start))
        except OSError:
            for fd in (ours_in, theirs_out, theirs_in, ours_out):
                os.close(fd)
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        os.close(theirs_in)
        os.close(theirs_out)
        self.inbox = Connection(ours_in, writable=False)
        self.outbox = Connection(ours_out, readable=False)
        self.send(("start", start))
        self.reader: threading.Thread | None = None

    def _env(self, start: Start) -> dict[str, str]:
        """The helper's environment, its temporary files (rerun servers, sandboxes) kept
        in this helper's own folder: a helper killed for not stopping in time leaves
        nothing behind that :meth:`close` does not remove."""
        temp = self.work / "tmp"
        temp.mkdir()
        return {**(start.setup.base_env or os.environ), "TMPDIR": str(temp)}

    def begin(self, session: Session, *, ask: Callable[[ProposalRequest], Any],
              progress: Callable[[str], None]) -> None:
        """The session started: what the helper needs to know now, and who answers."""
        self.ask = ask
        self.progress = progress
        self.send(("session", session))
        self.reader = threading.Thread(target=self._read, name="kernelfix-helper-reader",
                                       daemon=True)
        self.reader.start()

    @property
    def alive(self) -> bool:
        return not self.done.is_set() or self.report is not None

    def send(self, message: tuple[Any, ...]) -> bool:
        try:
            with self._send_lock:
                self.outbox.send(message)
        except (OSError, ValueError):
            return False
        return True

    def failed(self, failure: Failure) -> None:
        self.send(("failed", failure))

    def passed(self, test: PassedTest) -> None:
        if test.launches:  # only a test that launched a kernel can be a regression test
            self.send(("passed", test))

    def _read(self) -> None:
        while True:
            try:
                message = self.inbox.recv()
            except (EOFError, OSError):
                self.error = self.error or f"the healing helper ended early{self._tail()}"
                self.done.set()
                return
            kind = message[0]
            if kind == "line":
                self.progress(message[1])
            elif kind == "propose":
                threading.Thread(target=self._answer, args=message[1:],
                                 name="kernelfix-hook", daemon=True).start()
            elif kind == "report":
                self.report = message[1]
                self.done.set()
            elif kind == "error":
                self.failure = raised(message[1], message[2])
                self.done.set()

    def _answer(self, number: int, request: ProposalRequest) -> None:
        try:
            reply: tuple[Any, ...] = ("ok", self.ask(request))
        except KeyboardInterrupt:  # Ctrl-C in the hook: the session's, as in the main thread
            reply = ("raised", "KeyboardInterrupt", "")
            _thread.interrupt_main()
        except Exception as error:
            reply = ("raised", type(error).__name__, str(error))
        self.send(("answer", number, reply))

    def finish(self, inputs: SessionInputs, cancel: Cancel) -> SessionReport | None:
        """Heal the session (the bugs under way first), waiting for its report; None when
        the helper is gone (the caller heals in this process). What stopped it there is
        raised here. An interrupted session (``cancel`` set) asks for the report of what
        was healed; the first Ctrl-C or SIGTERM while waiting sets ``cancel`` and asks the
        helper to stop (its report comes back marked interrupted), a second is raised."""
        why = cancel.why if cancel.is_set() else ""
        if self.done.is_set() or not self.send(("finish", inputs, why)):
            return None
        while True:
            try:
                while not self.done.wait(0.1):  # short waits: Ctrl-C reaches this thread
                    pass
                break
            except KeyboardInterrupt as stop:
                if why:  # asked twice
                    raise
                why = interrupt_name(stop)
                cancel.set(why)
                self.send(("cancel", why))
        if self.failure is not None:
            raise self.failure
        return self.report

    def close(self) -> None:
        """End the helper (it ends its heals and its rerun servers) and its pipes."""
        self.send(("stop",))
        with contextlib.suppress(OSError):
            self.outbox.close()
        try:
            self.process.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            self.process.wait()
        if self.reader is not None:
            self.reader.join(STOP_WAIT)
        with contextlib.suppress(OSError):
            self.inbox.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def _tail(self) -> str:
        """The end of the helper's output, when it said anything (why it ended)."""
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f" ({lines[-1][:300]})" if lines else ""


# -- the helper's side --------------------------------------------------------------------


#: How much lower the helper's priority (and so that of everything it starts: the warm
#: server, every rerun) is than the test run's: it takes the cores the tests leave.
NICE = 10


def main() -> None:
    """The helper process: heal while the tests run, then the session, until stopped."""
    with contextlib.suppress(OSError):
        os.nice(NICE)
    inbox = Connection(int(sys.argv[1]), writable=False)
    outbox = Connection(int(sys.argv[2]), readable=False)
    Healer(inbox, outbox).serve()


class Healer:
    """The helper's loop: records in, lines and hook calls out, the report at the end."""

    def __init__(self, inbox: Connection, outbox: Connection) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.lock = threading.Lock()
        self.answers: dict[int, queue.SimpleQueue[tuple[Any, ...]]] = {}
        self.numbers = itertools.count()
        self.cancel = Cancel()  # the session's first Ctrl-C or SIGTERM, said to us

    def send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError, ValueError), self.lock:
            self.outbox.send(message)

    def line(self, text: str) -> None:
        self.send(("line", text))

    def ask(self, request: ProposalRequest) -> Any:
        """Call the conftest hook in the test process and wait for its answer."""
        number = next(self.numbers)
        answer: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.answers[number] = answer
        self.send(("propose", number, request))
        reply = answer.get()
        del self.answers[number]
        if reply[0] == "raised" and reply[1] == "KeyboardInterrupt":  # Ctrl-C in the hook
            raise KeyboardInterrupt(reply[2] or CTRL_C)
        if reply[0] == "raised":
            raise raised(reply[1], reply[2])
        return reply[1]

    def serve(self) -> None:
        start: Start = self.inbox.recv()[1]
        redact.listed(start.settings.redact_env)  # as the test process redacts
        with Reruns() as reruns:
            reruns.prestart(start.setup)  # its imports run while the helper imports its own
            # start-up: the healing code loads here, beside the warm server's imports
            from pytest_kernelfix.session.overlap import Overlap

            try:
                message = self.inbox.recv()
            except (EOFError, OSError):
                message = ("stop",)
            if message[0] != "session":  # the session never started: nothing to heal
                reruns.close()
                os._exit(0)
            session: Session = message[1]
            overlap = Overlap(settings=start.settings, project=start.project,
                              setup=start.setup,
                              stages=lambda: self.stages(start, session, reruns),
                              test_processes=session.test_processes, progress=self.line,
                              cancel=self.cancel, changes=session.changes)
            finishing: threading.Thread | None = None
            while True:
                try:
                    message = self.inbox.recv()
                except (EOFError, OSError):
                    break
                kind = message[0]
                if kind == "failed":
                    overlap.failed(message[1])
                elif kind == "passed":
                    overlap.passed(message[1])
                elif kind == "answer":
                    waiting = self.answers.get(message[1])
                    if waiting is not None:
                        waiting.put(message[2])
                elif kind == "cancel":
                    self.cancel.set(message[1])
                elif kind == "finish" and finishing is None:
                    if message[2]:  # the test run was interrupted
                        self.cancel.set(message[2])
                    finishing = threading.Thread(target=self.finish,
                                                 args=(overlap, message[1]),
                                                 name="kernelfix-finish", daemon=True)
                    finishing.start()
                elif kind == "stop":
                    break
            overlap.stop()
            for waiting in list(self.answers.values()):  # nobody will answer any more
                waiting.put(("raised", "FixerError", "the session ended"))
        overlap.join(STOP_WAIT)
        os._exit(0)  # the daemon threads still asking a model are left behind

    def stages(self, start: Start, session: Session, reruns: Reruns) -> Stages:
        # start-up: loaded in the helper process only, once its warm server started
        from pytest_kernelfix.fixers.hook import HookFixer
        from pytest_kernelfix.heal.guards import build_guard
        from pytest_kernelfix.session.inputs import Stages

        def ask(request: ProposalRequest) -> Any:
            return self.ask(request) if session.hooked else None

        fixer = HookFixer(ask, configured_fixer(start.settings), hooked=session.hooked)
        return Stages(fixer=fixer, guard=build_guard(start.project), runner=reruns,
                      progress=self.line, cancel=self.cancel)

    def finish(self, overlap: Overlap, inputs: SessionInputs) -> None:
        """The session's healing, the bugs under way handed over; its report back."""
        # start-up: loaded in the helper process only, once its warm server started
        from pytest_kernelfix.fixers.hook import UnavailableFixer
        from pytest_kernelfix.session.pipeline import run_healing

        try:
            if self.cancel.is_set():  # nothing more is asked; what was healed is kept
                overlap.fixer = overlap.fixer or UnavailableFixer(
                    f"the session was interrupted ({self.cancel.why})")
            report = run_healing(inputs, overlap.stages(), head=overlap)
            self.send(("report", replace(report, overlap=overlap.overlapped())))
        except BaseException as error:  # raised again in the test process
            self.send(("error", type(error).__name__, str(error)))
