"""Prompt files: what each round gave a model and what came back, one Markdown file per
round, ``prompts/<bug id>/round-<n>.md`` in the report dir.

They let a user see what was sent without reading their own server's logs. Each file
names the fixer, where the answer came from and what the round cost, then holds every
message under its role and the raw answer, each fenced. The loop kept them redacted and
bounded (:data:`~pytest_kernelfix.heal.outcomes.KEEP_CHARS` characters each, the middle
of a longer one left out and said so), and the file is redacted again as it is written.
A prompt no model was sent (a replay renders the one its recorded model stood for) is
labelled so; a round with neither a prompt nor an answer gets no file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pytest_kernelfix import __version__
from pytest_kernelfix.atomic import replace_file
from pytest_kernelfix.heal.outcomes import Exchange, RoundRecord
from pytest_kernelfix.markdown import fence
from pytest_kernelfix.redact import redact

#: The folder of the prompt files inside the report dir.
PROMPTS_DIR = "prompts"
#: The first line of every prompt file: what tells a stale one from a user's file.
PROMPT_MARKER = "<!-- Generated-by: pytest-kernelfix"


def prompt_file(group_id: str, record: RoundRecord) -> str:
    """The round's prompt file relative to the report dir; "" when it has none."""
    if record.exchange.empty:
        return ""
    return f"{PROMPTS_DIR}/{group_id}/round-{record.round}.md"


def prompt_markdown(group_id: str, record: RoundRecord) -> str:
    """The prompt file of one round (redacted by the caller, as it is written)."""
    exchange, usage = record.exchange, record.usage
    cost = (f"{usage.calls} call(s), {usage.prompt_tokens} prompt + "
            f"{usage.completion_tokens} completion tokens, ${usage.cost:.4f}")
    lines = [
        f"{PROMPT_MARKER} {__version__} -->",
        f"# `{group_id}`, round {record.round}",
        "",
        f"- Fixer: `{record.source or 'fixer'}`",
        *([f"- Answer from: {exchange.origin}"] if exchange.origin else []),
        f"- Prompt: {prompt_status(exchange, record.usage.prompt_chars)}",
        f"- Cost: {cost}" + (" (from the answer cache: free)" if usage.cache_hits else ""),
        f"- Outcome: {record.outcome}",
    ]
    for index, (role, content) in enumerate(exchange.messages, start=1):
        lines += ["", f"## Message {index}: {role}", "", fence(content)]
    lines += ["", "## Answer", ""]
    lines.append(fence(exchange.answer) if exchange.answer else "(none)")
    return "\n".join(lines) + "\n"


def prompt_status(exchange: Exchange, chars: int) -> str:
    """Whether the messages below were sent, in words."""
    count = len(exchange.messages)
    size = f", {chars} characters" if chars else ""
    if not count:
        return "none: the plugin sent no prompt for this answer"
    if not exchange.sent:
        return (f"not sent: {count} message(s){size}, rendered the way a model would get "
                "them; no model was asked in this session")
    if not exchange.answer:
        return f"sent: {count} message(s); the call got no answer (see the outcome)"
    return f"sent to the model: {count} message(s){size}"


def write_prompt_files(report_dir: Path,
                       rounds: Iterable[tuple[str, RoundRecord]]) -> tuple[str, ...]:
    """Write the prompt file of every (bug id, round) that has one; returns their names."""
    written = []
    for group_id, record in rounds:
        name = prompt_file(group_id, record)
        if name:
            text = redact(prompt_markdown(group_id, record))
            # An answer may hold lone surrogates: shown escaped, never a failed write.
            replace_file(report_dir / name, text.encode("utf-8", "backslashreplace"))
            written.append(name)
    return tuple(written)


def remove_stale_prompts(report_dir: Path, keep: Iterable[str]) -> None:
    """Delete prompt files an earlier session wrote that this session did not write
    again, then the folders left empty."""
    folder = report_dir / PROMPTS_DIR
    if not folder.is_dir():
        return
    kept = set(keep)
    for path in folder.glob("*/round-*.md"):
        if path.relative_to(report_dir).as_posix() in kept:
            continue
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                head = handle.read(len(PROMPT_MARKER))
        except OSError:
            continue
        if head == PROMPT_MARKER:
            path.unlink(missing_ok=True)
    for bug_folder in (*folder.iterdir(), folder):
        try:
            bug_folder.rmdir()  # only when empty
        except OSError:
            continue
