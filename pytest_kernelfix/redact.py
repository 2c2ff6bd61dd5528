"""Keep secrets out of prompts, cassettes and reports.

Tracebacks and logs routinely carry API keys (an environment dump, a failed request).
Two kinds are removed: the values of environment variables whose names say they are
secret, and strings shaped like well-known keys, wherever they came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

MARKER = "[REDACTED]"

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_MIN_SECRET_LENGTH = 6

#: Shapes of well-known credentials: OpenAI/Anthropic, GitHub, AWS, Slack, Google,
#: Hugging Face, and bearer tokens in HTTP headers.
KEY_SHAPES = re.compile(
    r"sk-[A-Za-z0-9_\-]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"
    r"|AIza[0-9A-Za-z_\-]{35}"
    r"|hf_[A-Za-z0-9]{30,}"
    r"|(?<=Bearer )[A-Za-z0-9._\-]{16,}"
)


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of secret-named variables, longest first so overlaps redact whole."""
    env = os.environ if environ is None else environ
    values = {
        value
        for name, value in env.items()
        if _SECRET_NAME.search(name) and _could_be_secret(value)
    }
    return tuple(sorted(values, key=len, reverse=True))


def _could_be_secret(value: str) -> bool:
    """Short values, paths and numbers in a secret-named variable are settings, not keys."""
    stripped = value.strip()
    if len(stripped) < _MIN_SECRET_LENGTH or stripped.startswith(("/", "~", ".")):
        return False
    return not stripped.replace(".", "").isdigit()


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret replaced by :data:`MARKER`."""
    for value in secret_values(environ):
        text = text.replace(value, MARKER)
    return KEY_SHAPES.sub(MARKER, text)
