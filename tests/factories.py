"""Values for tests that build a session or a report by hand, with test defaults."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.config import Settings
from pytest_kernelfix.heal.outcomes import HEALED, HealResult
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.report.model import BugReport


def make_settings(root: Path, **changes: object) -> Settings:
    """Healing on, two rounds, the interpreter, no base to compare with (git and the
    last-green record stay out of unit sessions); ``changes`` override any field."""
    values: dict[str, object] = dict(
        heal=True, apply=False, rounds=2, model="scripted", api_base="", llm_timeout=1.0,
        llm_retries=0, report_dir=root / ".kernelfix", timeout=10.0, device="interpret",
        record=None, prompts_dir=None, max_groups=10, target="cuda:90", cuda_shim=True,
        sandbox_exclude=(), paths=(), rootdir=root, root=root, base="none",
    )
    values.update(changes)
    return Settings(**values)  # type: ignore[arg-type]


def make_group(root: Path, *nodeids: str, launched: bool = True) -> BugGroup:
    """A bug whose failing tests are ``nodeids`` (their files under ``root``), each having
    launched ``gelu_kernel`` when ``launched``."""
    launches = (KernelLaunch("gelu_kernel", str(root / "kernels" / "gelu.py"), 4),)
    failures = tuple(
        Failure(nodeid, str(root / nodeid.split("::")[0]),
                ErrorInfo("AssertionError", "Tensor-likes are not close!"), "longrepr",
                launches if launched else ())
        for nodeid in nodeids)
    return BugGroup("gelu_kernel-assertionerror-abc123", "gelu_kernel", "sig",
                    ("kernels/gelu.py",), failures)


def make_bug_report(root: Path, name: str, original: str, final: str, status: str) -> BugReport:
    """Bug ``<name>_kernel-assertionerror-abc123``: one test under ``root/tests`` failing,
    ``kernels/<name>.py`` launched (its line 4) and editable; healed means ``final``."""
    path = f"kernels/{name}.py"
    failure = Failure(
        f"tests/test_{name}.py::test_{name}", str(root / "tests" / f"test_{name}.py"),
        ErrorInfo("AssertionError", "Tensor-likes are not close!",
                  (Frame(str(root / "tests" / f"test_{name}.py"), 9, f"test_{name}"),)),
        "longrepr", (KernelLaunch(f"{name}_kernel", str(root / path), 4),))
    group = BugGroup(f"{name}_kernel-assertionerror-abc123", f"{name}_kernel", "sig", (path,),
                     (failure,))
    healed = status == HEALED
    result = HealResult(group.id, status, "healed in round 1" if healed else "not healed",
                        original={path: original}, final={path: final} if healed else {})
    return BugReport(group, result, f"{group.id}.patch" if healed else "")
