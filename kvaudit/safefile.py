"""Reading a file kvaudit is pointed at, bounded before anything is read: settings, baselines, inventories.

Such a file may be hostile (a ``./kvaudit.toml`` in a cloned repository, a symlink to ``/dev/zero``, a FIFO that
never answers, an 8 GiB sparse file): it is opened without blocking (``O_NONBLOCK``: opening a FIFO for reading
does not wait for a writer), must be a regular file (``fstat`` on the open descriptor, so a symlink is judged by
what it reaches, with no race between the check and the read), and is read only up to its bound; a file over the
bound is refused, never cut (half a settings file is another file). Errors name the file, never its content."""

from __future__ import annotations

import os
import stat

from kvaudit.errors import KvauditError


def read_regular(path: str | os.PathLike[str], limit: int, what: str,
                 error: type[KvauditError] = KvauditError) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; else ``error`` with one line that names
    ``what`` (``config file``, ``--baseline``) and the path."""
    where = f"{what} {os.fspath(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket"
                    if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise error(f"{where}: {kind}, not a regular file: refused")
        if st.st_size > limit:
            raise error(f"{where}: {st.st_size:,} bytes, over kvaudit's bound of {limit:,}: refused")
        chunks, got = [], 0
        while got <= limit:
            try:
                b = os.read(fd, min(1 << 20, limit + 1 - got))
            except OSError as exc:
                raise error(f"cannot read {where}: {exc.strerror or exc}") from None
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:  # it grew while being read
            raise error(f"{where}: over kvaudit's bound of {limit:,} bytes: refused")
        return b"".join(chunks)
    finally:
        os.close(fd)
