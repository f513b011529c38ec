"""A rotated log (logrotate's ``sglang.log.1.gz``) read as the log it holds (issue 38, item 5): decompressed as it is
scanned, bounded, and never handed to grep as the compressed file."""

from __future__ import annotations

import gzip
import io
import zlib
from typing import BinaryIO

from kvaudit.errors import KvauditError

#: a rotated log decompresses to at most this: logs compress 10-20 times, so this is a 200-400 MiB .gz; more is a
#: gzip bomb or not a log, refused (decompress it and pass the file)
MAX_GUNZIP_BYTES = 4 << 30


class RotatedLogError(KvauditError):
    """A .gz that is not a whole gzip file, or decompresses past the bound (exit 2)."""


class Gunzip(io.RawIOBase):
    """A gzip file read as the log it holds, to ``limit`` bytes at most. It has no descriptor, so the scanner reads
    the decompressed bytes (feeding grep through a pipe) and never greps the compressed file; a corrupt or
    overlong file ends its stream and says why in ``problem`` (the scanner's feeding thread must not raise)."""

    def __init__(self, fh: BinaryIO, limit: int = MAX_GUNZIP_BYTES) -> None:
        super().__init__()
        self._gz = gzip.GzipFile(fileobj=fh, mode="rb")
        self._limit = limit
        self.problem: str | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._gz.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._gz.seek(offset, whence)

    def read(self, size: int | None = -1) -> bytes:
        if self.problem is not None:
            return b""
        left = self._limit - self._gz.tell()
        if left <= 0:
            if self._gz.read(1):  # exactly the limit is fine; one byte more is not
                self.problem = (f"decompresses to more than {self._limit:,} bytes: decompress it and pass the "
                                "file")
            return b""
        try:
            return self._gz.read(left if size is None or size < 0 else min(size, left))
        except (OSError, EOFError, zlib.error) as exc:
            self.problem = f"not a whole gzip file ({exc})"
            return b""

    def readinto(self, buffer) -> int:  # noqa: ANN001
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def read_gzipped(name: str, fh: BinaryIO, limit: int = MAX_GUNZIP_BYTES):  # noqa: ANN201
    """The parsed log inside the gzip file ``fh``; a file that is not whole gzip, or too big, is one error."""
    from kvaudit.explain import read_log

    fh.seek(0)
    stream = Gunzip(fh, limit)
    try:
        log = read_log(stream)  # type: ignore[arg-type]
    except KvauditError:
        if stream.problem is not None:
            raise RotatedLogError(f"{name}: {stream.problem}") from None
        raise
    if stream.problem is not None:
        raise RotatedLogError(f"{name}: {stream.problem}")
    return log
