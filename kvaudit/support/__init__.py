"""What kvaudit models, as data: per engine, release ranges x pool kinds, KV dtypes and platforms ->
modelled / partly / not, each row naming the upstream code it was read from (``<engine>.toml`` beside this
file; docs/support.md is rendered from the same files).

The verdict consults it (:func:`kvaudit.verdict.settle`): a pool check, a geometry finding or advice that rests
on a row marked ``not`` is not emitted, and the report says "not modelled here" instead. An audit states what it
is (:class:`Subject`): the engine's release range as its lines establish it, the pool kinds it holds, its KV
dtype and its platform.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvaudit.record import Record, record
from kvaudit.versions import Version, VersionRange, parse_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HERE = Path(__file__).parent

#: the dimensions a row may describe, in the order the docs list them
DIMENSIONS = ("pool", "kv_dtype", "platform")
#: every value each dimension may take (a row naming another is an error the tests catch)
KINDS = {
    "pool": ("dense", "mla", "nsa", "swa", "mamba", "dsv4", "encoder_decoder", "draft", "backend_managed"),
    "kv_dtype": ("16bit", "fp8", "fp4", "int8", "int4", "mixed"),
    "platform": ("discrete", "unified", "cpu", "accelerator"),
}
#: how each kind reads in a sentence
KIND_WORDS = {
    "dense": "dense MHA/GQA attention", "mla": "MLA (latent) attention", "nsa": "NSA/DSA sparse attention (indexer)",
    "swa": "sliding-window layers", "mamba": "Mamba/linear-attention state pools",
    "dsv4": "DeepSeek-V4 compressed pools",
    "encoder_decoder": "encoder-decoder caches", "draft": "a speculative draft",
    "backend_managed": "caches a separate backend sizes and allocates itself", "16bit": "a 16-bit KV cache",
    "fp8": "an FP8 KV cache", "fp4": "an FP4 KV cache", "int8": "an INT8 KV cache", "int4": "an INT4 KV cache",
    "mixed": "different K and V element types", "discrete": "a card with memory of its own",
    "unified": "unified memory", "cpu": "a CPU backend (KV cache in host memory)",
    "accelerator": "an accelerator whose budget rule is its plugin's own (HPU, XPU, TPU, NPU, Neuron)",
}
LEVELS = ("modelled", "partly", "not")


@record
class Row(Record):
    engine: str
    dimension: str
    kind: str
    releases: VersionRange
    level: str
    source: str
    note: str = ""


@record
class Subject(Record):
    """What an audit is, for the table: its engine and release range, and one kind per dimension (pool kinds:
    every kind it holds)."""

    engine: str
    releases: VersionRange
    pool_kinds: tuple[str, ...]
    kv_dtype: str | None  # None: not known (not judged by this dimension)
    platform: str


@record
class Coverage(Record):
    """How much of a subject kvaudit models: the worst level over its kinds, and the rows that decided it."""

    level: str  # modelled | partly | not
    limits: tuple[str, ...]  # one sentence per kind not (or only partly) modelled, for the report

    @property
    def judged(self) -> bool:
        return self.level != "not"


def release_range(text: str | None) -> VersionRange:
    """An audit's ``engine_version`` (``0.5.9``, ``0.4.4..0.5.8``, ``>=0.5.13``, ``unknown``) as a range."""
    t = (text or "").strip()
    try:
        if t.startswith(">="):
            return VersionRange(parse_version(t[2:]), None)
        if ".." in t:
            lo, hi = t.split("..", 1)
            return VersionRange(parse_version(lo), parse_version(hi))
        if t and t != "unknown":
            v = parse_version(t)
            return VersionRange(v, v)
    except ValueError:
        pass
    return VersionRange((0,), None)


@lru_cache(maxsize=None)
def _doc(engine: str) -> dict[str, Any]:
    """An engine's table file, read once (empty for an engine without one: nothing is modelled)."""
    path = HERE / f"{engine}.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@lru_cache(maxsize=None)
def table(engine: str) -> tuple[Row, ...]:
    """Every row of an engine's table."""
    doc = _doc(engine)
    return tuple(Row(engine, dim, r["kind"], release_range(r["releases"]), r["level"], r["source"], r.get("note", ""))
                 for dim in DIMENSIONS for r in doc.get(dim, []))


def display(engine: str) -> str:
    return str(_doc(engine).get("display", engine))


def engines() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in HERE.glob("*.toml")))


def _covered(rows: list[Row], r: VersionRange) -> bool:
    """Do the rows' ranges together cover every release of ``r``? (rows may not leave a gap in the middle)"""
    lo: Version = r.lo
    for row in sorted(rows, key=lambda x: x.releases.lo):
        if row.releases.lo > lo:
            return False
        if row.releases.hi is None:
            return True
        if row.releases.hi >= lo:
            lo = row.releases.hi[:-1] + (row.releases.hi[-1] + 1,)  # the next release (0.5.8 -> 0.5.9)
            if r.hi is not None and lo > r.hi:
                return True
    return False


def level_of(engine: str, dimension: str, kind: str, releases: VersionRange) -> tuple[str, Row | None]:
    """The level of one kind over a release range: that of the rows covering it, the worst when they differ;
    ``not`` when no row covers the whole range (a release the table does not describe is not modelled)."""
    unknown = releases.lo == (0,) and releases.hi is None  # the lines name no era: the kind's own rows decide
    rows = [r for r in table(engine) if r.dimension == dimension and r.kind == kind
            and r.releases.overlaps(releases.lo, releases.hi)]
    if not rows:
        return "not", None
    worst = max(rows, key=lambda r: LEVELS.index(r.level))
    gap = not unknown and not _covered(rows, releases)
    if (gap or worst.level == "not") and any(r.level != "not" for r in rows):
        # the range straddles releases kvaudit models and releases it does not (the lines leave the era open):
        # the engine's own era rules decide, and the report says which part is not modelled
        return "partly", (worst if worst.level == "not" else None)
    if gap:
        return "not", None
    return worst.level, worst


def _limit(engine: str, kind: str, level: str, row: Row | None, releases: VersionRange) -> str:
    where = f"{display(engine)} {releases}" if releases.lo != (0,) or releases.hi is not None else display(engine)
    what = KIND_WORDS.get(kind, kind)
    if level == "not":
        return f"{what} in {where}" + (f" ({row.source})" if row is not None else "")
    if row is not None and row.level == "not":  # a range only part of which is modelled
        return f"{what} in {where}: not modelled in {row.releases} ({row.note or row.source})"
    if row is None:
        return f"{what} in {where}: only some of these releases are modelled (docs/support.md)"
    return f"{what} in {where}: {row.note if row.note else 'see docs/support.md'}"


def coverage(s: Subject) -> Coverage:
    """How much of the subject kvaudit models (levels: modelled < partly < not; the worst decides)."""
    checks = [("pool", k) for k in s.pool_kinds] + ([("kv_dtype", s.kv_dtype)] if s.kv_dtype else []) \
        + [("platform", s.platform)]
    worst = "modelled"
    limits = []
    for dim, kind in checks:
        level, row = level_of(s.engine, dim, kind, s.releases)
        if level != "modelled":
            limits.append(_limit(s.engine, kind, level, row, s.releases))
        if LEVELS.index(level) > LEVELS.index(worst):
            worst = level
    return Coverage(worst, tuple(limits))


def kv_dtype_kind(dtype: str | None) -> str | None:
    """A KV dtype as the engines spell it -> the table's kind; None when unknown or not stated."""
    if not isinstance(dtype, str) or not dtype.strip():
        return None
    d = dtype.replace("torch.", "").strip().lower()
    if d in ("auto", "bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float"):
        return "16bit"
    if "/" in d or "+" in d or ("k" in d.split("_")[0] and "v" in d.split("_")[0] and "mixed" in d):
        return "mixed"
    if d.startswith(("fp8", "float8", "mxfp8")) or d == "fp8_ds_mla":
        return "fp8"
    if d.startswith(("fp4", "float4", "nvfp4", "mxfp4")):
        return "fp4"
    if d in ("int8", "uint8", "8"):
        return "int8"
    if d in ("int4", "4"):
        return "int4"
    return None
