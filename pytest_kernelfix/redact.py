"""Keep secrets out of prompts, cassettes and reports.

Tracebacks and logs routinely carry API keys (an environment dump, a failed request, a
test that prints its settings). Three kinds are removed, wherever they appear:

- the values of environment variables whose names say they are secret (``KEY``,
  ``TOKEN``, ``SECRET``, ``PASSWORD``...), and of those the user lists
  (``kernelfix_redact_env``: names or globs);
- the values of environment variables that look like credentials whatever the variable
  is called (:func:`looks_like_credential`: one long token with a long run of letters
  and digits, as varied as a random key), the way a CI system masks its secrets by
  value;
- strings shaped like well-known keys, and the passwords (or key-shaped user names) in
  URLs, wherever they came from.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping

MARKER = "[REDACTED]"

#: ``PASS`` also holds ``PASSWORD``, ``PASSWD``, ``PASSPHRASE`` and ``DB_PASS``; ``PWD`` the
#: shell's working directory too, a path (kept); ``AUTH`` not ``AUTHOR``; ``DSN`` a URL
#: with a key in it (Sentry's).
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|PWD|CREDENTIAL|AUTH(?!OR)|DSN",
                          re.IGNORECASE)
_MIN_SECRET_LENGTH = 6
#: Values of variables the user lists are redacted from this length on (shorter ones
#: would blank out ordinary words and numbers).
_MIN_LISTED_LENGTH = 4

#: One token of the characters keys are written in (base64, URL-safe base64, hex,
#: prefixed keys such as ``rk_live_...``), with no path or URL in it.
_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=.]+")
#: A value is a credential by its shape from this length on, with this much entropy
#: (bits per character: random keys have 4 to 6; words and versions have less).
_MIN_TOKEN_LENGTH = 20
_MIN_RUN = 16
_MIN_ENTROPY = 3.0
_ALNUM = re.compile(r"[A-Za-z0-9]+")

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
#: The user information of a URL (``postgres://user:password@host``,
#: ``https://<key>@sentry.io/1``): its password, or a user name shaped like a key.
_USERINFO = re.compile(r"(?<=://)([^/\s:@]+)(?::([^/\s@]+))?(?=@)")

#: Variable names (or globs) whose values are always redacted: ``kernelfix_redact_env``,
#: set by the plugin for its session (:func:`listed`).
_listed: tuple[str, ...] = ()


def listed(names: Iterable[str]) -> None:
    """Redact the values of these variables too (names or ``fnmatch`` globs, case as
    written); ``()`` forgets them."""
    global _listed
    _listed = tuple(name.strip() for name in names if name.strip())


def looks_like_credential(value: str) -> bool:
    """A value shaped like a key, whatever its variable is called: one token of at least
    20 characters (not a path or a URL) holding a run of at least 16 letters and digits,
    both, with the entropy of a random string. Names such as model strings
    (``meta-llama/Llama-3.1-8B-Instruct``) are short words between separators: kept."""
    text = value.strip()
    if len(text) < _MIN_TOKEN_LENGTH or not _TOKEN.fullmatch(text):
        return False
    if text.startswith(("/", "~", ".")) or "//" in text:
        return False
    run = max(_ALNUM.findall(text), key=len, default="")
    if len(run) < _MIN_RUN or not any(c.isdigit() for c in run) or not any(
            c.isalpha() for c in run):
        return False
    counts = Counter(text)
    entropy = -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())
    return entropy >= _MIN_ENTROPY


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of secret-named, listed or credential-shaped variables, longest first so
    overlaps redact whole."""
    env = os.environ if environ is None else environ
    return _secrets(frozenset(env.items()), _listed)


@functools.lru_cache(maxsize=16)
def _secrets(items: frozenset[tuple[str, str]], names: tuple[str, ...]) -> tuple[str, ...]:
    """The secrets of one environment (cached: redaction runs on every string a report
    holds)."""
    values = set()
    for name, value in items:
        stripped = value.strip()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in names):
            if len(stripped) >= _MIN_LISTED_LENGTH:
                values.add(stripped)
        elif (_SECRET_NAME.search(name) and _could_be_secret(value)) or (
                looks_like_credential(value)):
            values.add(stripped)
        # a URL's password, wherever else it is printed (``DATABASE_URL``)
        values.update(password for _, password in _USERINFO.findall(stripped)
                      if len(password) >= _MIN_LISTED_LENGTH)
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
    return KEY_SHAPES.sub(MARKER, _USERINFO.sub(_userinfo, text))


def _userinfo(match: re.Match[str]) -> str:
    user, password = match.group(1), match.group(2)
    if password is not None:
        return f"{user}:{MARKER}"
    return MARKER if looks_like_credential(user) else user
