"""Report files are written whole or not at all (issue 21, item 7): a reader that opens ``-o report.json``, the
CSV or the HTML while a fleet run writes it sees the previous file or the new one, never a truncated one.

The text goes to a temporary file in the target's directory, is flushed to disk (fsync), takes the mode the file
had (or the one a plain ``open`` would give under the umask), and is renamed over the target in one step. A
symlink is followed to the regular file it names (an operator's ``report.html -> /srv/www/...`` keeps working).
A target that is not a regular file (``/dev/stdout``, a FIFO, ``/dev/full``) is written directly: renaming over
a device node would replace it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def _mode_for(target: Path) -> int:
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic_with(path: str | os.PathLike[str], produce: Callable[[str], None], mode: int | None = None) -> Path:
    """``produce(tmp_path)`` writes the content to a temporary path beside ``path``; it then replaces ``path``.
    ``mode``: the file's permissions (default: the old file's, else what ``open`` gives under the umask)."""
    target = Path(path)
    if target.exists() and not target.is_file():  # a device or FIFO: write to it, never rename over it
        produce(str(target))
        return target
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or Path("."))
    os.close(fd)
    try:
        produce(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode_for(target) if mode is None else mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def write_atomic(path: str | os.PathLike[str], text: str, mode: int | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all."""
    def produce(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    return write_atomic_with(path, produce, mode)
