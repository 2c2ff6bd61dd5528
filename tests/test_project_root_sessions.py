"""Whole sessions where pytest's rootdir is a test folder, not the project.

A repository that keeps a config file of its own in ``tests/`` (a formatter's
``tests/pyproject.toml``) makes pytest take ``tests/`` as its rootdir when the tests are
run as ``pytest tests``; the kernels beside that folder are still the project's. The
plugin heals them from the project root, reruns the tests with the user's rootdir and
config, and writes its reports at the project root.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_project import BUGS, KERNEL, TESTS, git_init, report_of

#: A test folder's own config: a formatter's settings, nothing for pytest.
FORMATTER_ONLY = "[tool.black]\nline-length = 100\n"

#: The tests also check that they run where the user ran them: from the project's top,
#: with the test folder as rootdir and its pyproject.toml as config (reruns included).
WHERE_THEY_RUN = '''

@pytest.fixture(autouse=True)
def runs_as_the_user_ran_it(request):
    tests = Path(__file__).parent
    assert request.config.rootpath == tests
    assert request.config.inipath == tests / "pyproject.toml"
    assert Path.cwd() == tests.parent
'''


def make_split_project(top: Path, test_config: str = FORMATTER_ONLY) -> Path:
    """``kernels/ops.py`` (the tanh bug, which recipes heal) beside ``tests/``, whose own
    ``pyproject.toml`` makes it pytest's rootdir; returns the kernel file."""
    (top / "kernels").mkdir(parents=True)
    (top / "kernels" / "__init__.py").write_text("")
    kernel = top / "kernels" / "ops.py"
    kernel.write_text(KERNEL.format(line=BUGS["tanh"]))
    (top / "tests").mkdir()
    tests = TESTS.replace("import pytest\n", "from pathlib import Path\n\nimport pytest\n")
    (top / "tests" / "test_ops.py").write_text(tests + WHERE_THEY_RUN)
    (top / "tests" / "pyproject.toml").write_text(test_config)
    return kernel


def heal(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """``pytest tests --kernelfix`` from the project's top (kernels import from there)."""
    return pytester.runpytest_subprocess("tests", "-p", "no:cacheprovider", "--kernelfix",
                                         *args)


def test_a_git_project_heals_from_its_top_level(pytester: pytest.Pytester) -> None:
    top = pytester.path
    kernel = make_split_project(top)
    before = kernel.read_bytes()
    git_init(top)
    result = heal(pytester)

    result.assert_outcomes(failed=5)  # the failures stay failures
    result.stdout.fnmatch_lines([
        f"kernelfix: project root {top} (pytest's rootdir tests/ is a test folder in it; "
        "the git work tree's top level)",
        "healed    scale_kernel-*: 1 round(s), 5 test(s), kernels/ops.py*",
        "*git apply .kernelfix/scale_kernel-*.patch",
    ])
    (bug,) = report_of(top)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    assert "-    y = x * factor + tl.tanh(x) * 0" in (top / ".kernelfix" / bug["patch"]).read_text()
    assert not (top / "tests" / ".kernelfix").exists()
    assert kernel.read_bytes() == before  # report mode never touches the tree


def test_a_project_without_git_is_found_by_its_pyproject(pytester: pytest.Pytester) -> None:
    top = pytester.path
    make_split_project(top)
    (top / "pyproject.toml").write_text('[project]\nname = "scaled"\nversion = "0"\n')
    result = heal(pytester, "-k", "test_scale_zeros_by_zero or 2.0-100")

    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        f"kernelfix: project root {top} (pytest's rootdir tests/ is a test folder in it; "
        "the nearest folder above the rootdir with a pyproject.toml)",
    ])
    (bug,) = report_of(top)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    assert not (top / "tests" / ".kernelfix").exists()


def test_a_root_given_in_the_test_folders_config_wins(pytester: pytest.Pytester) -> None:
    """In a repository of several projects, the ini file names the project's folder
    (relative to the ini file): not the git top level."""
    repo = pytester.path
    project = repo / "proj"
    make_split_project(project, '[tool.pytest.ini_options]\nkernelfix_root = ".."\n')
    git_init(repo)
    result = pytester.runpytest_subprocess("proj/tests", "--kernelfix", "--collect-only")
    result.stdout.fnmatch_lines([f"kernelfix: project root {project} (set by ini kernelfix_root)"])
