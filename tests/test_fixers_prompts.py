"""The prompt a model sees: packaged templates, user overrides, strict rendering."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from fake_llm import GELU_SOURCE, GELU_TEST, sample_request

from pytest_kernelfix.fixers.prompting import (
    FEEDBACK_TEMPLATE,
    PACKAGE,
    SYSTEM_TEMPLATE,
    USER_TEMPLATE,
    PromptError,
    fence,
    render_messages,
)
from pytest_kernelfix.locate.context import SourceFile


def test_round_one_shows_the_bug_and_the_rules() -> None:
    system, user = render_messages(sample_request())
    assert (system["role"], user["role"]) == ("system", "user")
    rules = system["content"]
    for fact in ("Edit only the editable files", "never edit them", "Keep launching the Triton",
                 "2 * tl.sigmoid(2 * x) - 1", "tl.constexpr", "fp32", "mask=",
                 '"old_string"', '"replace_all": false', '"anchor"', "exactly"):
        assert fact in rules
    text = user["content"]
    # The kernel is shown whole, byte for byte, in a fence and without line numbers.
    assert f"### kernels/gelu.py\n```python\n{GELU_SOURCE}```" in text
    assert f"### tests/test_gelu.py (read-only: never edit)\n```python\n{GELU_TEST}```" in text
    assert "AttributeError: module 'triton.language' has no attribute 'tanh'" in text
    assert "kernels/gelu.py:15 in gelu_kernel: y = 0.5 * x * (1.0 + tl.tanh(u))" in text
    assert "E   InterpreterError: AttributeError(...)" in text
    assert "- compile the kernel for cuda:90 (no GPU needed)" in text
    assert "Triton interpreter" in text and "libdevice" in text
    assert "tests/test_gelu.py::test_gelu" in text
    assert "round 1" in text and "Earlier rounds" not in text


def test_later_rounds_add_the_feedback_section() -> None:
    request = sample_request(round=2)
    _, user = render_messages(request)
    text = user["content"]
    assert "round 2" in text
    assert f"```text\n{request.feedback}\n```" in text
    assert f"```diff\n{request.cumulative_diff}```" in text
    assert "- round 1: edit applied; the test failed with NameError" in text
    # The feedback comes after the files, before the closing instruction.
    assert text.index("kernels/gelu.py\n```") < text.index("Earlier rounds")
    assert text.rstrip().endswith("Answer with the JSON object only.")


def test_current_candidate_files_are_shown_not_the_originals() -> None:
    patched = SourceFile("kernels/gelu.py", GELU_SOURCE.replace("tl.tanh(u)", "my_tanh(u)"))
    _, user = render_messages(sample_request(round=2, files=(patched,)))
    assert "my_tanh(u)" in user["content"]
    assert "1.0 + tl.tanh(u)" not in user["content"].split("## Editable files")[1].split("##")[0]


def test_cuda_device_drops_the_interpreter_caveats() -> None:
    request = sample_request()
    request = replace(request, context=replace(request.context, device="cuda"))
    _, user = render_messages(request)
    assert "CUDA GPU" in user["content"]
    assert "TRITON_INTERPRET" not in user["content"]


def test_fence_outgrows_backticks_in_the_text() -> None:
    text = 'doc = """\n```python\nx\n```\n"""\n'
    fenced = fence(text, "python")
    assert fenced.startswith("````python\n") and fenced.endswith("\n````")
    assert fence("a") == "```\na\n```"


def test_override_directory_replaces_only_its_templates(tmp_path: Path) -> None:
    (tmp_path / USER_TEMPLATE).write_text(
        "Fix {{ group_id }} ({{ error.type }}) in {{ files | length }} file(s).\n"
        "{% include 'feedback.j2' %}\n"
    )
    system, user = render_messages(sample_request(round=2), prompts_dir=tmp_path)
    packaged_system, _ = render_messages(sample_request(round=2))
    assert system == packaged_system
    assert user["content"].startswith("Fix gelu_kernel-ab12cd (AttributeError) in 1 file(s).")
    assert "## Earlier rounds" in user["content"]  # the packaged feedback.j2 filled in


def test_an_override_of_an_included_template_is_used(tmp_path: Path) -> None:
    (tmp_path / FEEDBACK_TEMPLATE).write_text("PREVIOUSLY: {{ feedback }}\n")
    _, user = render_messages(sample_request(round=2), prompts_dir=tmp_path)
    assert "PREVIOUSLY: tests/test_gelu.py::test_gelu still fails" in user["content"]
    assert "## Earlier rounds" not in user["content"]


def test_a_misspelt_variable_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / SYSTEM_TEMPLATE).write_text("Rules\n\n{{ eror.headline }}\n")
    with pytest.raises(PromptError) as info:
        render_messages(sample_request(), prompts_dir=tmp_path)
    message = str(info.value)
    assert str(tmp_path / SYSTEM_TEMPLATE) in message
    assert "line 3" in message and "'eror' is undefined" in message


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / USER_TEMPLATE).write_text("ok\n{% if round %}\nnever closed\n")
    with pytest.raises(PromptError, match=r"fix\.j2, line \d+: Unexpected end of template"):
        render_messages(sample_request(), prompts_dir=tmp_path)


def test_a_missing_override_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="does not exist"):
        render_messages(sample_request(), prompts_dir=tmp_path / "nope")


def test_packaged_templates_come_from_the_package_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    package = resources.files(PACKAGE)
    for name in (SYSTEM_TEMPLATE, USER_TEMPLATE, FEEDBACK_TEMPLATE):
        assert package.joinpath(name).is_file()
    assert len(render_messages(sample_request(round=2))) == 2
