"""The options a rerun of a few nodeids keeps from the session, and those it drops.

Everything the suite's configuration would add that breaks a rerun of a few nodeids
(xdist, ``-x``, coverage, report files, ``-k``/``-m``, stepwise, debuggers) is left out
of its ``addopts``; the session's own plugin and import options are carried over; and
absolute paths under the original root point at the sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from enum import Enum
from pathlib import Path


class _Arity(Enum):
    NONE = "none"  # a flag
    ONE = "one"  # exactly one value: --opt=V or --opt V
    OPTIONAL = "optional"  # --opt, --opt=V, or --opt V when V does not look like an option
    MANY = "many"  # every following token that does not look like an option


_N, _1, _OPT, _MANY = _Arity.NONE, _Arity.ONE, _Arity.OPTIONAL, _Arity.MANY

#: Long options a rerun of a few nodeids must not inherit, with how many values they take.
_DROPPED_LONG: dict[str, _Arity] = {
    # xdist: the child runs a handful of tests in one process
    "--numprocesses": _1, "--maxprocesses": _1, "--dist": _1, "--tx": _1, "--px": _1,
    "--max-worker-restart": _1, "--maxschedchunk": _1, "--rsyncdir": _1,
    "--rsyncignore": _1, "--looponfail": _N, "--testrunuid": _1,
    "--loadscope-reorder": _N, "--no-loadscope-reorder": _N,
    # stopping early would hide the outcome of the other nodeids
    "--exitfirst": _N, "--maxfail": _1,
    # coverage and report files would overwrite the real run's artifacts
    "--cov": _OPT, "--cov-report": _1, "--cov-config": _1, "--cov-fail-under": _1,
    "--cov-append": _N, "--cov-branch": _N, "--cov-context": _1, "--cov-precision": _1,
    "--cov-reset": _N, "--no-cov": _N, "--no-cov-on-fail": _N,
    "--junitxml": _1, "--junit-xml": _1, "--junitprefix": _1, "--junit-prefix": _1,
    "--html": _1, "--self-contained-html": _N, "--css": _1,
    "--json-report": _N, "--json-report-file": _1, "--json-report-summary": _N,
    "--json-report-omit": _MANY, "--json-report-indent": _1, "--json-report-verbosity": _1,
    "--report-log": _1, "--result-log": _1, "--resultlog": _1, "--alluredir": _1,
    "--basetemp": _1,
    # cacheprovider and stepwise are off in the child
    "--lf": _N, "--last-failed": _N, "--ff": _N, "--failed-first": _N, "--nf": _N,
    "--new-first": _N, "--lfnf": _1, "--last-failed-no-failures": _1, "--cache-clear": _N,
    "--cache-show": _OPT, "--sw": _N, "--stepwise": _N, "--sw-skip": _N,
    "--stepwise-skip": _N, "--sw-reset": _N, "--stepwise-reset": _N,
    # repeating or re-running multiplies the cost of every candidate
    "--count": _1, "--repeat-scope": _1, "--reruns": _1, "--reruns-delay": _1,
    "--only-rerun": _1,
    # selection and debuggers: the nodeids are the selection; nobody is at the terminal
    "--deselect": _1, "--pdb": _N, "--pdbcls": _1, "--trace": _N,
    # a rerun runs its tests
    "--collect-only": _N, "--co": _N, "--setup-only": _N, "--setup-plan": _N,
    # set by the rerun itself
    "--rootdir": _1, "--config-file": _1, "--inifile": _1,
}

#: Option families dropped whatever follows the prefix.
_DROPPED_PREFIXES = ("--kernelfix", "--cov-", "--json-report-")

#: Short options that are dropped: flags, and options that take a value.
_DROPPED_SHORT_FLAGS = frozenset("xfd")
_DROPPED_SHORT_VALUES = frozenset("nkmc")
#: Short options (pytest's and xdist's) whose value is the rest of the cluster or the
#: next token.
_SHORT_VALUES = frozenset("nkmcpoWr")


def _long_arity(name: str) -> _Arity | None:
    """How many values a dropped long option takes; None when it is kept."""
    if name in _DROPPED_LONG:
        return _DROPPED_LONG[name]
    if name.startswith(_DROPPED_PREFIXES):
        return _Arity.OPTIONAL  # unknown arity: take a value only if one follows
    return None


def _looks_like_option(token: str) -> bool:
    return token.startswith("-") and token != "-"


def _drop_plugin(value: str) -> bool:
    """``-p kernelfix`` or ``-p pytest_kernelfix.plugin`` would load the healer in reruns."""
    return "kernelfix" in value and not value.startswith("no:")


def _skip_values(tokens: Sequence[str], i: int, arity: _Arity) -> int:
    """The index after the separate values of a dropped long option at ``i - 1``."""
    if arity is _Arity.ONE:
        return i + 1
    while arity is not _Arity.NONE and i < len(tokens) and not _looks_like_option(tokens[i]):
        i += 1
        if arity is _Arity.OPTIONAL:
            break
    return i


def filter_addopts(args: Sequence[str]) -> tuple[str, ...]:
    """Drop the options that would break or leak out of a rerun of a few nodeids.

    Handles ``--opt=value`` and ``--opt value``, short clusters (``-xvs`` keeps
    ``-vs``; ``-rxX`` is ``-r`` with the value ``xX``) and attached values (``-n2``).
    """
    tokens = list(args)
    kept: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("--"):
            name, has_value, _ = token.partition("=")
            arity = _long_arity(name)
            if arity is None:
                kept.append(token)
            elif not has_value:
                i = _skip_values(tokens, i, arity)
        elif _looks_like_option(token):
            following = tokens[i] if i < len(tokens) else None
            short, consumed = _filter_cluster(token, following)
            kept.extend(short)
            i += consumed
        else:
            kept.append(token)
    return tuple(kept)


def _filter_cluster(token: str, following: str | None) -> tuple[list[str], int]:
    """Filter one short-option cluster; returns the tokens to keep and how many of the
    following tokens it consumed (a value given separately)."""
    letters = token[1:]
    flags = ""
    for index, letter in enumerate(letters):
        if letter not in _SHORT_VALUES:
            if letter not in _DROPPED_SHORT_FLAGS:
                flags += letter
            continue
        attached = letters[index + 1 :]
        value, consumed = (attached, 0) if attached or following is None else (following, 1)
        dropped = letter in _DROPPED_SHORT_VALUES or (
            letter == "p" and _drop_plugin(value.lstrip("="))
        )
        if dropped:
            return ([f"-{flags}"] if flags else []), consumed
        if flags == letters[:index]:  # nothing before the value was dropped
            return [token, *([value] if consumed else [])], consumed
        return [f"-{flags}{letter}{attached}", *([value] if consumed else [])], consumed
    if flags == letters:
        return [token], 0
    return ([f"-{flags}"] if flags else []), 0


def map_root_paths(args: Sequence[str], source: Path, target: Path) -> tuple[str, ...]:
    """Point absolute paths under ``source`` (alone or after ``--opt=``) at ``target``.

    An ini value such as ``--confcutdir=/project/tests`` would otherwise make the rerun
    ignore the sandbox's conftest files.
    """
    roots = {str(source)}
    roots.add(os.path.realpath(source))

    def rewrite(text: str) -> str:
        for root in roots:
            if text == root or text.startswith(root + os.sep):
                return str(target) + text[len(root) :]
        return text

    mapped = []
    for arg in args:
        prefix, eq, value = arg.partition("=")
        if eq and arg.startswith("-"):
            mapped.append(prefix + eq + rewrite(value))
        else:
            mapped.append(rewrite(arg))
    return tuple(mapped)


def carried_args(args: Sequence[str], positional: Sequence[str] = ()) -> tuple[str, ...]:
    """The session's command line as a rerun of a few nodeids needs it.

    The project's own options go along (a conftest's ``--mode quick`` picks the shapes a
    node id runs: without it the same node id tests something else), with plugins,
    warnings and strictness. What :func:`filter_addopts` drops stays behind, and so do the
    ``positional`` arguments (paths and node ids: the rerun's nodeids are its selection),
    ``-o addopts=...`` (the rerun sets its own filtered ``addopts``) and ``-p kernelfix``
    by any name (the rerun's agent stands in for it).
    """
    places = set(positional)
    tokens = filter_addopts([arg for arg in args if arg not in places])
    kept: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        name, value = _override(token)
        if name is not None and not value and index < len(tokens):
            value = tokens[index]
            index += 1
            token = f"{token}={value}" if token.startswith("--") else f"{token}{value}"
        if name is not None and value.startswith("addopts="):
            continue
        kept.append(token)
    return tuple(kept)


def _override(token: str) -> tuple[str | None, str]:
    """``-o`` / ``--override-ini`` and its attached value, if ``token`` is one."""
    if token.startswith("--override-ini"):
        name, _, value = token.partition("=")
        return (name, value) if name == "--override-ini" else (None, "")
    if token.startswith("-o") and not token.startswith("--"):
        return "-o", token[2:].lstrip("=")
    return None, ""
