"""Markdown the plugin writes for people and models: one code fence for every stage."""

from __future__ import annotations


def fence(text: str, language: str = "") -> str:
    """``text`` in a Markdown code fence longer than any backtick run inside it."""
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    ticks = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{ticks}{language}\n{body}{ticks}"
