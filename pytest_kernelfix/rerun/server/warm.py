"""What the server imports before it forks, and the rewritten code its children share.

The server imports, in a child's order, what every rerun child imports before its
conftest files: pytest with its builtin plugins, the ``pytest11`` plugins (through
pytest's assertion rewriter, so that a child's pytest finds them rewritten and does not
warn), the plugin's agent, shim and gate modules, numpy, torch and triton, and two
library modules torch and triton import on a test's first use. Never a module of the
project: plugins found under the project root are skipped, and anything a warm import
pulled in from it is dropped again.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Modules every rerun child imports before its conftest files, besides pytest.
WARM_MODULES = (
    "pytest_kernelfix.rerun.child.bootstrap",
    "pytest_kernelfix.rerun.child.agent",
    "pytest_kernelfix.config",
    "pytest_kernelfix.hookspecs",
    "pytest_kernelfix.device",
    "pytest_kernelfix.shim",
    "pytest_kernelfix.shim.cuda",
    "pytest_kernelfix.shim.driver",
    "pytest_kernelfix.shim.libdevice",
    "pytest_kernelfix.shim.libdevice_numpy",
    "pytest_kernelfix.shim.scalars",
    "pytest_kernelfix.shim.leaks",
    "numpy",
    "torch",
    "triton",
    "triton.language",
    "triton.runtime.interpreter",
    "pytest_kernelfix.rerun.probes.gate",
    # Imported by torch and triton on a test's first use, seconds each: torch.testing's
    # assert_close imports torch.distributed.tensor, a launch's specialisation imports
    # gluon. Neither queries nor captures a device at import (checked against the shim).
    "torch.distributed.tensor",
    "triton.experimental.gluon",
)


def warm_up(root: str) -> list[str]:
    """Import what a rerun child imports before its conftest files, through pytest's
    assertion rewriter where pytest would rewrite it; nothing under ``root``. Returns
    the modules imported."""
    import pytest  # noqa: F401
    from _pytest.config import get_config

    config = get_config()  # imports and registers pytest's builtin plugins
    hook = _rewrite_hook(config)
    warmed = []
    try:
        for name in _entry_point_plugins(root):
            with contextlib.suppress(Exception):  # a broken plugin fails in the child
                __import__(name)
                warmed.append(name)
        for name in WARM_MODULES:
            with contextlib.suppress(ImportError):
                __import__(name)
                warmed.append(name)
    finally:
        if hook is not None and hook in sys.meta_path:
            sys.meta_path.remove(hook)
    forget_project(root)
    share_rewrites(Path.cwd() / "rewritten")
    gc.collect()
    gc.freeze()  # children skip the server's objects in their collections
    return warmed


def _rewrite_hook(config: Any) -> Any:
    """pytest's assertion rewriter on ``sys.meta_path``, with the plugins marked as a
    child's pytest will mark them: plugin modules imported through it count as
    rewritten in the child, and read as in a fresh child."""
    try:
        from _pytest.assertion import AssertionState
        from _pytest.assertion.rewrite import AssertionRewritingHook, assertstate_key
    except ImportError:
        return None
    config.stash[assertstate_key] = AssertionState(config, "rewrite")
    hook = AssertionRewritingHook(config)
    disable = bool(os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"))
    with contextlib.suppress(Exception):  # a private method of pytest: warm less if gone
        config._mark_plugins_for_rewrite(hook, disable)
    sys.meta_path.insert(0, hook)
    return hook


def _entry_point_plugins(root: str) -> list[str]:
    """Modules of the ``pytest11`` plugins a rerun child loads: not ``kernelfix``, which
    every rerun blocks, nor a plugin living in the project."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    from importlib.metadata import entry_points

    names = []
    for entry in entry_points(group="pytest11"):
        module = entry.value.partition(":")[0].strip()
        if entry.name != "kernelfix" and module and not _in_project(module, root):
            names.append(module)
    return names


def _in_project(module: str, root: str) -> bool:
    """Whether ``module``'s top-level package lives under ``root`` (found, not imported)."""
    try:
        spec = importlib.util.find_spec(module.partition(".")[0])
    except (ImportError, ValueError):
        return False
    if spec is None or not root:
        return False
    places = [spec.origin or "", *(spec.submodule_search_locations or ())]
    return any(place and is_within(place, root) for place in places)


def is_within(path: str, root: str) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base + os.sep)


def forget_project(root: str) -> None:
    """Drop any module a warm import pulled in from the project: children import it."""
    if not root:
        return
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None)
        if isinstance(filename, str) and is_within(filename, root):
            del sys.modules[name]


def share_rewrites(directory: Path) -> None:
    """Let the children share pytest's rewritten code through ``directory``."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    directory.mkdir(exist_ok=True)
    rewrite._rewrite_test = RewriteCache(rewrite._rewrite_test, directory)


class RewriteCache:
    """pytest's rewritten test, conftest and plugin code, cached by source hash.

    pytest keeps rewritten code in ``__pycache__`` files, which reruns never write
    (``PYTHONDONTWRITEBYTECODE``: a candidate written twice in one second must not be
    read back stale), so every fresh child rewrites the same test modules and plugin
    packages again. The children of one server share this cache instead. Entries are
    keyed by path and checked against the hash of the current source, as pytest checks
    its own, so an edited file is rewritten anew. A rewrite that warned, or one with
    ``enable_assertion_pass_hook`` on, is never cached.
    """

    def __init__(self, rewrite: Callable[[Path, Any], tuple[bytes, Any]], directory: Path) -> None:
        self.rewrite = rewrite
        self.directory = directory

    def __call__(self, fn: Path, config: Any) -> tuple[bytes, Any]:
        import hashlib
        import marshal
        import warnings

        try:
            plain = not config.getini("enable_assertion_pass_hook")
        except (ValueError, AttributeError):
            plain = False
        if not plain:
            return self.rewrite(fn, config)
        source_hash = importlib.util.source_hash(Path(fn).read_bytes())
        entry = self.directory / (hashlib.sha256(str(fn).encode()).hexdigest() + ".pyc")
        with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
            data = entry.read_bytes()
            if data[:len(source_hash)] == source_hash:
                return source_hash, marshal.loads(data[len(source_hash):])
        with warnings.catch_warnings(record=True) as caught:
            digest, code = self.rewrite(fn, config)
        for warning in caught:  # shown as without the cache, and never cached
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
        if not caught and digest == source_hash:
            temp = entry.with_name(f"{entry.name}.{os.getpid()}")
            with contextlib.suppress(OSError, ValueError):
                temp.write_bytes(digest + marshal.dumps(code))
                os.replace(temp, entry)
        return digest, code
