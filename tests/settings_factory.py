"""A :class:`Settings` for tests that build a session by hand, with test defaults."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelfix.config import Settings


def make_settings(root: Path, **changes: object) -> Settings:
    """Healing on, two rounds, the interpreter; ``changes`` override any field."""
    values: dict[str, object] = dict(
        heal=True, apply=False, rounds=2, model="scripted", api_base="", llm_timeout=1.0,
        llm_retries=0, report_dir=root / ".kernelfix", timeout=10.0, device="interpret",
        record=None, prompts_dir=None, max_groups=10, target="cuda:90", cuda_shim=True,
        sandbox_exclude=(), paths=(), rootdir=root,
    )
    values.update(changes)
    return Settings(**values)  # type: ignore[arg-type]
