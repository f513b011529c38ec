"""The exact weight bytes of a model directory, from its safetensors headers (or the index's total_size).

A ``.safetensors`` file begins with an 8-byte little-endian header length and that many bytes of JSON: each
tensor's dtype, shape and ``data_offsets`` [begin, end) in the data that follows (the format's specification,
huggingface/safetensors README "Format"). The weights are the sum of the tensors' byte ranges; nothing else of
the file is read. ``model.safetensors.index.json`` carries ``metadata.total_size`` (bytes), written by
``transformers``' ``save_pretrained``; it is used when the shards themselves are not there.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from kvaudit.errors import KvauditError

#: a header is a few MiB for the largest models (one entry per tensor); a hostile length is refused, not read
MAX_HEADER_BYTES = 100 << 20
MAX_SHARDS = 4096


class WeightsError(KvauditError):
    pass


@dataclass(frozen=True)
class Weights:
    total_bytes: int
    source: str  # "safetensors headers (N files)" | "model.safetensors.index.json total_size"
    files: int


def header_bytes(path: Path) -> int:
    """The tensor bytes one safetensors file holds, from its header alone."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise WeightsError(f"{path.name}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES:
                raise WeightsError(f"{path.name}: a header of {n:,} bytes announced, over kvaudit's bound of "
                                   f"{MAX_HEADER_BYTES:,} (not a safetensors file, or a damaged one)")
            text = fh.read(n)
            size = path.stat().st_size
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
        return Weights(sum(header_bytes(p) for p in shards), f"safetensors headers ({len(shards)} files)",
                       len(shards))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            doc = json.loads(index.read_text(encoding="utf-8")[: 64 << 20])
            total = doc["metadata"]["total_size"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            raise WeightsError(f"{index}: no metadata.total_size") from None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            raise WeightsError(f"{index}: metadata.total_size is not a positive number of bytes")
        return Weights(total, "model.safetensors.index.json total_size", 0)
    return None
