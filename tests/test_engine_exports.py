"""The edit engine's public names: lazy package exports."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import pytest_kernelfix.engine as engine


@pytest.mark.parametrize("name", engine.__all__)
def test_every_lazy_export_resolves_to_its_submodule(name: str) -> None:
    value = getattr(engine, name)
    module = importlib.import_module(f"pytest_kernelfix.engine.{engine._EXPORTS[name]}")
    assert value is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = engine.nothing


def test_cumulative_diff_is_still_importable_from_files() -> None:
    from pytest_kernelfix.engine import diff, files

    assert files.cumulative_diff is diff.cumulative_diff


def test_the_parser_does_not_import_the_matcher() -> None:
    code = (
        "import sys, pytest_kernelfix.engine.parse; "
        "print('rapidfuzz' in sys.modules, 'pytest_kernelfix.engine.match' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
