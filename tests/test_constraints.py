"""constraints.txt, the lock `make demo` and `make test` install from, agrees with pyproject.

pyproject.toml keeps ranges for users; the lock pins one exact release of everything, so a
set-up made tomorrow gets the versions the suite is green with today.
"""

from __future__ import annotations

import re
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
COMPROMISED_LITELLM = ("1.82.7", "1.82.8", "1.107.0")


def lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][0-9A-Za-z.!]*)", line)
        assert match, f"not an exact pin without a local label: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in pins, f"pinned twice: {name}"
        pins[name] = Version(match[2])
    return pins


def project() -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def requirements() -> list[Requirement]:
    """The package's own dependencies and those of every extra (dev, bench)."""
    meta = project()
    declared = [*meta["dependencies"], *chain(*meta["optional-dependencies"].values())]
    return [Requirement(text) for text in declared]


def test_every_dependency_is_pinned_within_its_range() -> None:
    pins = lock()
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is a dependency but the lock does not pin it"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )


def test_the_project_itself_is_not_in_the_lock() -> None:
    assert canonicalize_name(str(project()["name"])) not in lock()


@pytest.mark.parametrize("version", COMPROMISED_LITELLM)
def test_compromised_litellm_releases_are_never_allowed(version: str) -> None:
    assert lock()["litellm"] != Version(version)
    [litellm] = [r for r in requirements() if canonicalize_name(r.name) == "litellm"]
    assert not litellm.specifier.contains(version, prereleases=True)
