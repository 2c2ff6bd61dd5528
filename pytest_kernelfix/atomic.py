"""Replace a file in one step: a temporary file beside it, then ``os.replace``.

A new inode every time, so a hardlinked twin is never written through, a reader never
sees half a file, and the permission bits stay those of the file replaced.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def replace_file(target: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``target`` atomically; ``mode`` defaults to the current one."""
    if mode is None:
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = 0o644
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".kfx")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
