"""The terms every engine's plan shares: the card's total as CUDA reports it, the weights per rank, the engine's
fraction (given, or the release's default), the block rounding of a KV budget into tokens, the concurrency at a
context length. Each engine's ``planner`` module puts them into its own formula (kvaudit/reconcile/<engine>/).
"""

from __future__ import annotations

import math
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.model_config import ModelGeometry
from kvaudit.planning import calibrate
from kvaudit.planning.model import ASSUMED, CALIBRATED, DEFAULT, FORMULA, GIVEN, PlanInput, Term
from kvaudit.units import GIB, Interval

#: what loading the weights takes beyond the checkpoint's bytes per rank, when no startup of the model says:
#: buffers allocated with the weights (rotary caches, MoE workspaces), allocator rounding
WEIGHT_OVERHEAD_GIB = 0.5  # plus up to 2 % of the weights
WEIGHT_OVERHEAD_SHARE = 0.02
#: what CUDA reports as the card's total (``torch.cuda.mem_get_info()[1]``) below nvidia-smi's memory.total: the
#: driver's reserved memory. Corpus: 0.37 GiB (RTX PRO 6000, vllm_c013), 0.41 (RTX 4090, vllm_c007/c014), 0.44
#: (RTX 5090, vllm_c012), 0.68 (A100 80 GB, vllm_c006); the range is a little wider than what was seen
CUDA_TOTAL_OFFSET_GIB = (0.3, 0.8)


class PlanError(KvauditError):
    pass


def release(inp: PlanInput, since: tuple[int, ...], refusal: str, caps: bool = False, drafts: bool = False,
            dp_attention: bool = False, newest: tuple[int, ...] | None = None, newest_basis: str = ""
            ) -> tuple[int, ...]:
    """The planned release as a version tuple; ``refusal`` says why releases before ``since`` are not planned.
    A release past ``newest`` (the newest kvaudit models, compared at its own precision: (0, 33) admits 0.33.2,
    (0, 5, 23) admits no 0.5.24) is refused as not modelled, never planned by the newest rules under its name: a
    future release, or a typo such as 9.9.9. Settings this engine's plan does not have are refused rather than
    silently ignored: ``caps`` (a token cap), ``drafts`` (a speculative draft), ``dp_attention``."""
    from kvaudit.versions import format_version, parse_version

    try:
        version = parse_version(inp.version)
    except ValueError:
        raise PlanError(f"--engine {inp.engine}=={inp.version}: not a release number") from None
    if version < since:
        raise PlanError(f"{inp.engine} {inp.version}: {refusal}")
    if newest is not None and version[:len(newest)] > newest:
        raise PlanError(f"--engine {inp.engine}=={inp.version}: not modelled here: the newest {inp.engine} release "
                        f"kvaudit models is {format_version(newest)}" + (f" ({newest_basis})" if newest_basis else "")
                        + "; a later release may size its pool differently (or is this a typo?)")
    if inp.draft is not None and not drafts:
        raise PlanError(f"--draft: a speculative draft is planned for SGLang only; {inp.engine}'s draft layers and "
                        "their pool are not modelled by plan")
    if inp.dp_attention > 1 and not dp_attention:
        raise PlanError(f"--dp-attention is SGLang's; {inp.engine} has no data-parallel attention to plan")
    if inp.max_total_tokens and not caps:
        raise PlanError(f"--max-total-tokens: {inp.engine} has no such cap kvaudit plans")
    return version


def replayed_or_config(inp: PlanInput) -> int | None:
    """A replayed startup's own bytes per token, or None when the config.json gives them; neither is an error."""
    cell = replayed_cell(inp)
    if inp.geometry is None and cell is None:
        raise PlanError("the model's config.json is needed for the bytes per token")
    return cell


def weakest(*kinds: str) -> str:
    """The least established of the kinds a derived term rests on."""
    order = (ASSUMED, CALIBRATED, FORMULA, GIVEN)
    # a release default is as exact as a formula's term: what rests on it is the formula's
    return min((FORMULA if k == DEFAULT else k for k in kinds), key=order.index)


def cuda_total(inp: PlanInput, history: Any, engine_words: str) -> Term:
    """The card's total as the engine reads it (vLLM and TensorRT-LLM take their fraction of it, or of what it
    leaves): the history's own startups on this card, else the card's memory.total less the driver's reserve."""
    return card_memory(inp, history, "total GPU memory (as CUDA reports it)", CUDA_TOTAL_OFFSET_GIB,
                       f"the driver reserves, which {engine_words} never sees")


def card_memory(inp: PlanInput, history: Any, label: str, offset: tuple[float, float], gone: str) -> Term:
    """The engine's first reading of the card (``t_gib``): a replayed startup's own, the history's startups on this
    card (and release, ranks), else the card's memory.total less ``offset`` GiB, ``gone`` saying what took it."""
    if inp.given_t is not None:
        return Term("t_gib", label, *inp.given_t, "GiB", GIVEN, "the replayed startup's own")
    obs = calibrate.pre_load_free(history, inp)
    if obs is not None:
        return Term("t_gib", label, obs.lo, obs.hi, "GiB", CALIBRATED, obs.basis)
    card = inp.gpu_total_mib / 1024
    lo_off, hi_off = offset
    return Term("t_gib", label, card - hi_off, card - lo_off, "GiB", ASSUMED,
                f"the card's {card:.2f} GiB (memory.total) less {lo_off}-{hi_off} GiB {gone}; no startup on this "
                "card in the history")


def weights(inp: PlanInput, history: Any, logged: bool = False) -> Term:
    """The weights per rank: what loading this model took in the history's startups of the family, else the
    checkpoint's bytes over the ranks, plus what is loaded with them (assumed). ``logged``: calibrate on the
    weight figure the engine logs (vLLM's "Model loading took", the ledger's weights) instead of T - post."""
    label = "weights per rank (what loading took)"
    obs = (calibrate.logged_weights if logged else calibrate.weight_memory)(history, inp)
    if obs is not None:
        return Term("weights_gib", label, obs.lo, obs.hi, "GiB", CALIBRATED, obs.basis)
    if not inp.weight_bytes:
        raise PlanError("the weights per rank are unknown: give the model directory (its safetensors headers or "
                        "model.safetensors.index.json), or a --history with a startup of this model at this TP")
    return checkpoint_weights("weights_gib", label, inp.weight_bytes, inp.weight_source, inp.tp * inp.pp)


def checkpoint_weights(key: str, label: str, nbytes: int, source: str | None, ranks: int) -> Term:
    """A checkpoint's bytes over the ranks (formula), plus what loads with them (assumed)."""
    even = nbytes / ranks / GIB
    return Term(key, label, even, even * (1 + WEIGHT_OVERHEAD_SHARE) + WEIGHT_OVERHEAD_GIB, "GiB", ASSUMED,
                f"{nbytes:,} bytes ({source}) / {ranks} ranks = {even:.2f} GiB (formula), plus up to "
                f"{WEIGHT_OVERHEAD_GIB} GiB + {WEIGHT_OVERHEAD_SHARE:.0%} loaded with them (assumed; replicated "
                "embeddings and uneven expert splits not modelled)")


def fraction(inp: PlanInput, name: str, default: tuple[float, str] | None) -> Term:
    """The engine's fraction: --fraction, else the release's default (``default``: value and where it is set)."""
    if inp.fraction is not None:
        return Term("mem_fraction_static", name, inp.fraction, inp.fraction, "", GIVEN, "--fraction")
    if default is None:
        raise PlanError(f"give --fraction ({name}): this release's default is not known to kvaudit")
    value, source = default
    return Term("mem_fraction_static", name, value, value, "", DEFAULT, source)


def sum_terms(key: str, label: str, parts: list[Term], basis: str) -> Term:
    return Term(key, label, sum(t.lo for t in parts), sum(t.hi for t in parts), "GiB",
                weakest(*(t.kind for t in parts)), basis)


def interval(t: Term) -> Interval:
    return Interval(t.lo, t.hi)


def blocks_to_tokens(budget: Interval, cell: int, block: int) -> tuple[int, int]:
    """floor(budget / (block x bytes per token)) blocks of ``block`` tokens, at both ends of the budget."""
    per = cell * block
    lo = math.floor(max(0.0, budget.lo) * GIB / per) * block
    hi = math.floor(max(0.0, budget.hi) * GIB / per) * block
    return lo, hi


def concurrency(lo: int, hi: int, context: int | None, cap: int | None) -> tuple[int, int] | None:
    """Full-context requests the pool holds at once, at most ``cap`` (the engine's max running requests)."""
    if not context:
        return None
    c_lo, c_hi = lo // context, hi // context
    if cap:
        c_lo, c_hi = min(c_lo, cap), min(c_hi, cap)
    return c_lo, c_hi


def replayed_cell(inp: PlanInput) -> int | None:
    """A startup replayed by --validate brings its own bytes per token (its log's); None otherwise."""
    if not inp.bytes_per_token:
        return None
    return round(sum(inp.bytes_per_token) / 2)


def kv_element(inp: PlanInput, geometry: ModelGeometry | None = None) -> float:
    """The KV element size in bytes: the model's dtype for "auto" (``geometry``: another model's, a draft's), else
    the engine's name for it."""
    from kvaudit.model_config import element_bytes

    geom = geometry or inp.geometry
    assert geom is not None
    if inp.kv_dtype == "auto":
        return geom.dtype_bytes
    elt = element_bytes(inp.kv_dtype)
    if elt is None:
        raise PlanError(f"--kv-dtype {inp.kv_dtype}: not a KV dtype kvaudit knows the size of")
    return elt


def pool_starts(budget: Interval, lo: int, hi: int, context: int | None, engine_error: str,
                context_fatal: bool, empty_error: str | None = None) -> tuple[str, str]:
    """Whether a pool sized by a budget starts: ``engine_error`` is what the engine raises when the pool is empty
    (or, ``context_fatal``, cannot hold one request of the context length: vLLM checks max_model_len against its
    pool; the others shorten the session or queue the request); ``empty_error``, when the engine words an empty
    budget otherwise."""
    if budget.hi <= 0 or hi <= 0:
        return "no", f"the KV budget is not positive ({empty_error or engine_error})"
    if context and hi < context:
        if context_fatal:
            return "no", f"the pool holds fewer tokens than one {context:,}-token request ({engine_error})"
        return "at risk", f"the pool holds fewer tokens than one {context:,}-token request"
    if budget.lo <= 0 or lo <= 0:
        return "at risk", "the KV budget is not positive at the low end of the interval (the assumed terms decide)"
    if context and lo < context:
        return "at risk", f"at the low end the pool holds fewer tokens than one {context:,}-token request"
    return "yes", "the KV budget is positive" + (" and holds one full-context request" if context else "")
