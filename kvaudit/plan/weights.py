"""The exact weight bytes of a model directory, from its safetensors headers (or the index's total_size).

A ``.safetensors`` file begins with an 8-byte little-endian header length and that many bytes of JSON: each
tensor's dtype, shape and ``data_offsets`` [begin, end) in the data that follows (the format's specification,
huggingface/safetensors README "Format"). The weights are the sum of the tensors' byte ranges; nothing else of
the file is read. ``model.safetensors.index.json`` carries ``metadata.total_size`` (bytes), written by
``transformers``' ``save_pretrained``; it is used when the shards themselves are not there.

A model directory is untrusted input (a downloaded repository): every file is opened without blocking and must be
a regular file (a FIFO named ``*.safetensors`` is refused, never waited on), its size is known before a byte of it
is read (an index over 64 MiB, a header over 16 MiB are refused by their size, not read and cut), and a file that
several names reach (symlinks, hard links) is counted once.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

from kvaudit.errors import KvauditError
from kvaudit.record import record

#: a header is at most a few MiB for the largest models (one entry per tensor: DeepSeek-V3's largest shard header
#: is under 200 KiB); a hostile length is refused before it is read (json.loads of 100 MiB costs 1.2 GB)
MAX_HEADER_BYTES = 16 << 20
#: the headers of one model together (4,096 shards of 16 MiB would be 64 GiB of JSON)
MAX_HEADERS_TOTAL = 256 << 20
MAX_SHARDS = 4096
#: an index is a name-to-shard map: 64 MiB holds a million tensors
MAX_INDEX_BYTES = 64 << 20


class WeightsError(KvauditError):
    pass


@record
class Weights:
    total_bytes: int
    source: str  # "safetensors headers (N files)" | "model.safetensors.index.json total_size"
    files: int


def _open_regular(path: Path) -> int:
    """A descriptor on ``path`` when it is a regular file (a FIFO does not block the open: O_NONBLOCK)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise WeightsError(f"{path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WeightsError(f"{path}: not a regular file (a FIFO, a device or a directory): refused")
    return fd


def header_bytes(path: Path, fd: int | None = None) -> int:
    """The tensor bytes one safetensors file holds, from its header alone."""
    own = fd is None
    fd = _open_regular(path) if fd is None else fd
    try:
        with os.fdopen(fd, "rb", closefd=own) as fh:
            size = os.fstat(fd).st_size
            raw = fh.read(8)
            if len(raw) < 8:
                raise WeightsError(f"{path.name}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES:
                raise WeightsError(f"{path.name}: a header of {n:,} bytes announced, over kvaudit's bound of "
                                   f"{MAX_HEADER_BYTES:,} (not a safetensors file, or a damaged one)")
            if n > size - 8:
                raise WeightsError(f"{path.name}: the header is cut ({max(0, size - 8):,} of {n:,} bytes)")
            text = fh.read(n)
    except OSError as exc:
        raise WeightsError(f"{path}: {exc.strerror or exc}") from None
    if len(text) < n:
        raise WeightsError(f"{path.name}: the header is cut ({len(text):,} of {n:,} bytes)")
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        raise WeightsError(f"{path.name}: the header is not JSON") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: the header is not a JSON object")
    total, data = 0, size - 8 - n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(x, int) and not
                                                                           isinstance(x, bool) for x in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data):
            raise WeightsError(f"{path.name}: tensor {str(name)[:80]!r} has no valid data_offsets within the file")
        total += offsets[1] - offsets[0]
    return total


def model_weights(directory: Path) -> Weights | None:
    """The weight bytes of a model directory: its safetensors headers when the shards are there, else the index's
    total_size; None when it has neither (the plan then assumes the weights from the config)."""
    shards = sorted(directory.glob("*.safetensors"))
    if len(shards) > MAX_SHARDS:
        raise WeightsError(f"{directory}: {len(shards):,} safetensors files (kvaudit reads at most {MAX_SHARDS:,})")
    if shards:
        seen: set[tuple[int, int]] = set()
        total = count = announced = 0
        for p in shards:
            fd = _open_regular(p)
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) in seen:  # the same file by another name: counted once
                    continue
                seen.add((st.st_dev, st.st_ino))
                announced += min(st.st_size, MAX_HEADER_BYTES)
                if announced > MAX_HEADERS_TOTAL:
                    raise WeightsError(f"{directory}: the safetensors headers exceed kvaudit's bound of "
                                       f"{MAX_HEADERS_TOTAL:,} bytes together")
                total += header_bytes(p, fd)
                count += 1
            finally:
                os.close(fd)
        return Weights(total, f"safetensors headers ({count} files)", count)
    index = directory / "model.safetensors.index.json"
    if index.exists():
        from kvaudit.safefile import read_regular

        raw = read_regular(index, MAX_INDEX_BYTES, "the index", WeightsError)
        try:
            doc = json.loads(raw)
            total = doc["metadata"]["total_size"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise WeightsError(f"{index}: no metadata.total_size") from None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            raise WeightsError(f"{index}: metadata.total_size is not a positive number of bytes")
        return Weights(total, "model.safetensors.index.json total_size", 0)
    return None
