"""A plain (non-editable) install heals too: the prompts ship inside the wheel."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from fake_llm import Reply
from kernel_project import BUGS, GOOD_LINE, answer, make_project, report_of

REPO = Path(__file__).resolve().parents[1]


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_wheel_install_heals(pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory,
                             fake_llm) -> None:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a copy, so the build leaves nothing in the repository
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".kernelfix"))
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", work / "dist",
        source)
    (wheel,) = (work / "dist").glob("pytest_kernelfix-*.whl")
    run(sys.executable, "-m", "venv", "--without-pip", work / "venv")
    python = work / "venv" / "bin" / "python"
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                   .stdout.strip())
    run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
        "--target", purelib, wheel)
    # The dependencies (torch, triton, litellm...) come from this environment, appended
    # after the new venv's own site-packages, so the wheel's package is the one imported.
    (purelib / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    make_project(pytester)
    where = run(python, "-c", "import pytest_kernelfix, importlib.resources as r; "
                "print(pytest_kernelfix.__file__); "
                "print(sorted(p.name for p in r.files('pytest_kernelfix.prompts').iterdir()))",
                cwd=pytester.path).stdout
    assert str(purelib) in where.splitlines()[0]
    assert "'fix.j2'" in where and "'system.j2'" in where and "'feedback.j2'" in where

    fake_llm.script(Reply(answer(BUGS["offset"], GOOD_LINE)))
    session = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "--kernelfix",
         "--kernelfix-model=openai/fake-model", f"--kernelfix-api-base={fake_llm.url}"],
        cwd=pytester.path, capture_output=True, text=True, timeout=600,
    )
    assert session.returncode == 1, session.stdout + session.stderr  # failures stay
    assert "kernelfix" in session.stdout, session.stdout + session.stderr
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    system = fake_llm.requests[0]["messages"][0]["content"]  # rendered from the wheel
    assert "old_string" in system and "has no `tanh`" in system
