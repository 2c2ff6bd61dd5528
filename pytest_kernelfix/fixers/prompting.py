"""Render the chat messages a model sees for one round, from jinja2 templates.

The packaged templates live in the ``pytest_kernelfix.prompts`` package and are read
through :mod:`importlib.resources` only, so they are found in a wheel or a zip as well
as in a source checkout. A user directory (ini ``kernelfix_prompts_dir``) overrides any
template it contains; the packaged ones fill in the rest. Templates are strict: a
misspelt variable is an error that names the file and line, not a silently empty hole.
"""

from __future__ import annotations

import functools
import traceback
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from pytest_kernelfix.fixers.base import ProposalRequest
from pytest_kernelfix.locate.context import current_kernel_lines
from pytest_kernelfix.markdown import fence

PACKAGE = "pytest_kernelfix.prompts"
SYSTEM_TEMPLATE = "system.j2"
USER_TEMPLATE = "fix.j2"
FEEDBACK_TEMPLATE = "feedback.j2"

_LANGUAGES = {".py": "python", ".pyi": "python", ".cu": "cuda", ".cpp": "cpp", ".c": "c"}


class PromptError(ValueError):
    """A template could not be found, parsed or rendered; the message says where."""


def render_messages(
    request: ProposalRequest, *, prompts_dir: Path | None = None
) -> list[dict[str, str]]:
    """OpenAI-style messages for ``request``: the rules, then everything about the bug.

    Every round is rendered from scratch (no chat history): the current files, the
    feedback and the history of attempts say all the model needs.
    """
    env = _environment(None if prompts_dir is None else str(Path(prompts_dir).resolve()))
    variables = template_variables(request)
    return [
        {"role": "system", "content": _render(env, SYSTEM_TEMPLATE, variables)},
        {"role": "user", "content": _render(env, USER_TEMPLATE, variables)},
    ]


def template_variables(request: ProposalRequest) -> dict[str, Any]:
    """What the templates may use; documented here because user templates rely on it."""
    context = request.context
    files = request.files or context.editable
    return {
        "request": request,
        "context": context,
        "round": request.round,
        "group_id": context.group_id,
        "nodeids": context.nodeids,
        "error": context.error,
        "error_log": context.error_log,
        "kernel_lines": current_kernel_lines(context, files),
        "files": files,
        "tests": context.tests,
        "device": context.device,
        "interpreter": context.device != "cuda",
        "checks": context.checks,
        "notes": context.notes,
        "change": context.change,
        "feedback": request.feedback,
        "cumulative_diff": request.cumulative_diff,
        "history": request.history,
    }


def prompt_chars(request: ProposalRequest, *, prompts_dir: Path | None = None) -> int:
    """The size of the prompt ``request`` renders to, in characters (about 4 per token)."""
    return sum(len(message["content"]) for message in render_messages(
        request, prompts_dir=prompts_dir))


def language(path: str) -> str:
    return _LANGUAGES.get(Path(path).suffix, "")


@functools.lru_cache(maxsize=8)
def _environment(prompts_dir: str | None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = []
    if prompts_dir is not None:
        if not Path(prompts_dir).is_dir():
            raise PromptError(f"prompts directory {prompts_dir} does not exist")
        loaders.append(jinja2.FileSystemLoader(prompts_dir))
    loaders.append(jinja2.FunctionLoader(_packaged_template))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )
    env.filters["fence"] = fence
    env.filters["language"] = language
    return env


def _packaged_template(name: str) -> tuple[str, str, Any] | None:
    resource = resources.files(PACKAGE).joinpath(name)
    if not name.endswith(".j2") or not resource.is_file():
        return None
    return resource.read_text(encoding="utf-8"), f"<{PACKAGE}>/{name}", lambda: True


def _render(env: jinja2.Environment, name: str, variables: dict[str, Any]) -> str:
    try:
        return env.get_template(name).render(variables).strip() + "\n"
    except jinja2.TemplateSyntaxError as exc:
        where = exc.filename or exc.name or name
        raise PromptError(f"prompt template {where}, line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise PromptError(f"prompt template {exc.name} not found (rendering {name})") from None
    except Exception as exc:  # UndefinedError, or an error raised by template code
        where = _template_location(exc) or name
        message = str(exc) or type(exc).__name__
        raise PromptError(f"prompt template {where}: {message}") from None


def _template_location(exc: BaseException) -> str:
    """``file, line N`` of the innermost template frame (jinja2 rewrites tracebacks)."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename.endswith(".j2") or frame.filename == "<template>"
    ]
    if not frames:
        return ""
    return f"{frames[-1].filename}, line {frames[-1].lineno}"
