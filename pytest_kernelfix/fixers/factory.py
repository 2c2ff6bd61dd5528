"""Pick the fixer a model string names: ``recipes``, ``replay:PATH`` or a litellm model."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelfix.fixers.base import Fixer

REPLAY_PREFIX = "replay:"
RECIPES = "recipes"


def build_fixer(
    model: str,
    *,
    api_base: str | None = None,
    timeout: float = 120.0,
    num_retries: int = 2,
    prompts_dir: Path | None = None,
    record: Path | None = None,
    cache_dir: Path | None = None,
) -> Fixer:
    """The fixer for ``model``; ``record`` appends every live answer to a cassette.

    With ``cache_dir``, a litellm model's answers are cached there (see
    :mod:`pytest_kernelfix.fixers.cache`); recipes and cassettes cost nothing and are not.
    The cache sits inside the recorder, so a cassette also gets the answers a re-run
    found in the cache.
    """
    name = (model or "").strip()
    if not name:
        raise ValueError(
            "no kernelfix model configured: pass --kernelfix-model (or set KERNELFIX_MODEL) "
            "to a litellm model such as 'openai/gpt-4o', to 'recipes', or to "
            "'replay:path/to/cassette.jsonl'"
        )
    if name == RECIPES or name.startswith(REPLAY_PREFIX):
        if record is not None:
            raise ValueError(f"--kernelfix-record needs a live model, not {name!r}")
        if name == RECIPES:
            from pytest_kernelfix.fixers.recipes import RecipeFixer

            return RecipeFixer()
        from pytest_kernelfix.fixers.replay import ReplayFixer

        path = name[len(REPLAY_PREFIX):].strip()
        if not path:
            raise ValueError("replay: needs a cassette path, as in 'replay:cassettes/demo.jsonl'")
        return ReplayFixer(Path(path), prompts_dir=prompts_dir)
    from pytest_kernelfix.fixers.llm import LLMFixer, resolve_endpoint

    # The endpoint litellm would use, also when only the provider's own variables set it
    # (OPENAI_API_BASE...): the calls, the no-key rule and the cache key all follow it.
    endpoint = resolve_endpoint(name, api_base or "").url
    fixer: Fixer = LLMFixer(
        name,
        api_base=endpoint or None,
        timeout=timeout,
        num_retries=num_retries,
        prompts_dir=prompts_dir,
    )
    if cache_dir is not None:
        from pytest_kernelfix.fixers.cache import caching

        fixer = caching(fixer, cache_dir, model=name, api_base=endpoint,
                        prompts_dir=prompts_dir)
    if record is not None:
        from pytest_kernelfix.fixers.replay import RecordingFixer

        fixer = RecordingFixer(fixer, record)
    return fixer
