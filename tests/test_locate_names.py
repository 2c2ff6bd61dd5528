"""Errors about a name: which name, and which lines of the function that raised tell its
story (where it is bound, where it is used, under which branches)."""

from __future__ import annotations

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.locate.names import error_names, name_lines


@pytest.mark.parametrize(("kind", "message", "names"), [
    ("UnboundLocalError",
     "cannot access local variable 'acc' where it is not associated with a value", ("acc",)),
    ("UnboundLocalError", "local variable 'acc' referenced before assignment", ("acc",)),
    ("NameError", "name 'BLOCK' is not defined", ("BLOCK",)),
    ("NameError", "cannot access free variable 'scale' where it is not associated with a "
                  "value in enclosing scope", ("scale",)),
    ("AttributeError", "'NoneType' object has no attribute 'stride'", ("stride",)),
    ("AttributeError", "module 'triton.language' has no attribute 'fast_exp'", ("fast_exp",)),
    ("KeyError", "'BLOCK_M'", ("BLOCK_M",)),
    ("KeyError", "3", ()),  # a key that is no name says nothing about a line
    ("TypeError", "launch() got an unexpected keyword argument 'num_warp'", ("num_warp",)),
    ("TypeError", "k() missing 2 required positional arguments: 'n_cols' and 'BLOCK'",
     ("n_cols", "BLOCK")),
    ("TypeError", "f() got multiple values for argument 'eps'", ("eps",)),
    ("TypeError", "unsupported operand type(s) for +: 'int' and 'NoneType'", ()),
    ("AssertionError", "name 'x' is not defined", ()),  # only the kinds about a name
    ("RuntimeError", "shape mismatch", ()),
])
def test_the_name_an_error_is_about(kind: str, message: str, names: tuple[str, ...]) -> None:
    assert error_names(ErrorInfo(kind, message)) == names


WRAPPER = '''\
import torch


def launch(x, dtype=None):
    n = x.numel()
    if x.is_contiguous():
        flat = x.view(-1)
    else:
        flat = x.reshape(-1)
    step_1 = n + 1
    step_2 = n + 2
    step_3 = n + 3
    if dtype is None:
        acc = torch.zeros(n)
        note = "default"
    else:
        note = "cast"
        other = 1
    step_4 = n + 4
    step_5 = n + 5
    step_6 = n + 6
    for i in range(3):
        step_6 += i
        with torch.no_grad():
            acc += flat
    step_7 = n + 7
    try:
        result = acc.sum()
    except RuntimeError:
        result = None
    finally:
        step_7 += 1
    return result
'''


def _line(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_lines_of_a_name_and_the_branches_around_them() -> None:
    lines = WRAPPER.splitlines()
    raised = _line(WRAPPER, "acc += flat")
    kept = name_lines(WRAPPER, raised, ["acc"])
    shown = [lines[number - 1].strip() for number in kept]
    assert shown[0] == "def launch(x, dtype=None):"  # what the function is
    # the branch that binds it, and the one that does not (the story of the error)
    for line in ("if dtype is None:", "acc = torch.zeros(n)", "else:",
                 "for i in range(3):", "with torch.no_grad():", "acc += flat",
                 "try:", "result = acc.sum()", "except RuntimeError:", "finally:"):
        assert line in shown, line
    # the lines between two kept ones are kept when a cut would save only one or two
    assert 'note = "default"' in shown and 'note = "cast"' in shown
    # what the name does not touch is left to the cut
    for line in ("flat = x.reshape(-1)", "step_2 = n + 2", "step_5 = n + 5", "return result"):
        assert line not in shown, line


def test_a_name_the_function_never_mentions_marks_nothing() -> None:
    assert name_lines(WRAPPER, _line(WRAPPER, "acc += flat"), ["missing"]) == ()
    assert name_lines(WRAPPER, 1, ["acc"]) == ()  # no function holds line 1
    assert name_lines("def broken(:\n", 1, ["acc"]) == ()


def test_a_keyword_argument_and_a_string_key_are_uses_of_the_name() -> None:
    text = ('def run(meta, kernel, x):\n'
            '    grid = (meta["BLOCK_M"],)\n'
            '    other = 1\n'
            '    more = 2\n'
            '    again = 3\n'
            '    kernel[grid](\n'
            '        x,\n'
            '        BLOCK_M=64,\n'
            '    )\n')
    kept = name_lines(text, 6, ["BLOCK_M"])
    assert 2 in kept and 8 in kept
    assert 6 in kept  # the statement the keyword is part of starts there
    assert 4 not in kept
