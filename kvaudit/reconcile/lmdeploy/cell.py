"""Bytes per KV block, as each LMDeploy engine and era lays a block out (see the package docstring)."""

from __future__ import annotations


from kvaudit.versions import VersionRange
from kvaudit.record import record


@record
class Block:
    bytes: int | None  # per block, per rank; None when the inputs (or the era) do not determine it
    tokens: int
    description: str


def turbomind_block(layers: int, kv_heads: int, head_dim: int, tp: int, block_len: int, quant_policy: int,
                    era: VersionRange) -> Block:
    """``SequenceManager`` + ``block::Layout::block_size`` for the era the lines point to. Between 0.3 and 0.4 the
    layout changed (and ``quant_policy`` 4 went from int8 to int4): a range over both with a quantised cache is
    not determined."""
    if kv_heads % tp:
        return Block(None, block_len, f"{kv_heads} KV heads do not split over TP {tp}")
    heads = kv_heads // tp
    old = 2 * layers * heads * block_len * head_dim * (8 if quant_policy & 4 else 16) // 8
    q_bits = quant_policy if quant_policy in (4, 8) else 16
    t_bits = 16 if q_bits != 16 else 0
    kv_num = 1 if head_dim == 576 and era.lo >= (0, 13, 0) else 2
    new = layers * heads * kv_num * block_len * (head_dim * q_bits // 8 + 2 * t_bits // 8)
    before_04 = era.hi is not None and era.hi < (0, 4, 0)
    from_04 = era.lo >= (0, 4, 0)
    shape = f"{layers} layers x {heads} KV heads/rank x {block_len} tokens"
    if before_04 or (not from_04 and old == new):
        what = "int8" if quant_policy & 4 else "16-bit"
        return Block(old, block_len, f"2 (K,V) x {shape} x {head_dim} x {what} (SequenceManager, <=0.3) = {old:,} B")
    if from_04 or old == new:
        if q_bits == 16:
            what = f"{head_dim} x 2 B"
        else:
            what = f"({head_dim} x {q_bits} bits + a 16-bit scale and zero)"
        return Block(new, block_len, f"{kv_num} (K,V) x {shape} x {what} (block::Layout, 0.4+) = {new:,} B")
    return Block(None, block_len, f"quant_policy {quant_policy} meant int8 before 0.4 and int4 after; the log's era "
                                  f"({era}) spans both")


def pytorch_block(layers: int, kv_heads: int, head_dim: int, tp: int, block_len: int, quant_policy: int,
                  dtype_bytes: float = 2) -> Block:
    """``CacheEngine.get_cache_block_size``: K and V blocks per layer; quantised: uint8 data (int4 two per byte) and
    a scale/zero pair in the model dtype per head and token."""
    if kv_heads % tp and kv_heads > tp:
        return Block(None, block_len, f"{kv_heads} KV heads do not split over TP {tp}")
    heads = max(1, kv_heads // tp)
    if quant_policy in (4, 8):
        per = head_dim * quant_policy // 8 + int(2 * dtype_bytes)
        what = f"({head_dim} x {quant_policy} bits + scale and zero)"
    else:
        per = int(head_dim * dtype_bytes)
        what = f"{head_dim} x {dtype_bytes:g} B"
    b = 2 * layers * block_len * heads * per
    return Block(b, block_len, f"2 (K,V) x {layers} layers x {block_len} tokens x {heads} KV heads/rank x {what} "
                               f"(CacheEngine) = {b:,} B")
