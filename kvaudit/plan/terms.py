"""The terms every engine's plan shares: the card's total as CUDA reports it, the weights per rank, the engine's
fraction (given, or the release's default), the block rounding of a KV budget into tokens, the concurrency at a
context length. Each engine's ``planner`` module puts them into its own formula (kvaudit/reconcile/<engine>/).
"""

from __future__ import annotations

import math
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.plan import calibrate
from kvaudit.plan.model import ASSUMED, CALIBRATED, FORMULA, GIVEN, PlanInput, Term
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


def release(inp: PlanInput, since: tuple[int, ...], refusal: str, caps: bool = False) -> tuple[int, ...]:
    """The planned release as a version tuple; ``refusal`` says why releases before ``since`` are not planned.
    Settings this engine does not have are refused rather than silently ignored (``caps``: it has a token cap)."""
    from kvaudit.versions import parse_version

    try:
        version = parse_version(inp.version)
    except ValueError:
        raise PlanError(f"--engine {inp.engine}=={inp.version}: not a release number") from None
    if version < since:
        raise PlanError(f"{inp.engine} {inp.version}: {refusal}")
    if inp.draft is not None:
        raise PlanError(f"--draft: a speculative draft is planned for SGLang only; {inp.engine}'s draft layers and "
                        "their pool are not modelled by plan")
    if inp.dp_attention > 1:
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
    return min(kinds, key=order.index)


def cuda_total(inp: PlanInput, history: Any, engine_words: str) -> Term:
    """The card's total as the engine reads it (vLLM and TensorRT-LLM take their fraction of it, or of what it
    leaves): the history's own startups on this card, else the card's memory.total less the driver's reserve."""
    obs = calibrate.pre_load_free(history, inp) if inp.given_t is None else None
    label = "total GPU memory (as CUDA reports it)"
    if inp.given_t is not None:
        return Term("t_gib", label, *inp.given_t, "GiB", GIVEN, "the replayed startup's own")
    if obs is not None:
        return Term("t_gib", label, obs.lo, obs.hi, "GiB", CALIBRATED, obs.basis)
    card = inp.gpu_total_mib / 1024
    lo_off, hi_off = CUDA_TOTAL_OFFSET_GIB
    return Term("t_gib", label, card - hi_off, card - lo_off, "GiB", ASSUMED,
                f"the card's {card:.2f} GiB (memory.total) less {lo_off}-{hi_off} GiB the driver reserves, which "
                f"{engine_words} never sees; no startup on this card in the history")


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
    ranks = inp.tp * inp.pp
    even = inp.weight_bytes / ranks / GIB
    return Term("weights_gib", label, even, even * (1 + WEIGHT_OVERHEAD_SHARE) + WEIGHT_OVERHEAD_GIB, "GiB", ASSUMED,
                f"{inp.weight_bytes:,} bytes ({inp.weight_source}) / {ranks} ranks = {even:.2f} GiB (formula), plus "
                f"up to {WEIGHT_OVERHEAD_GIB} GiB + {WEIGHT_OVERHEAD_SHARE:.0%} loaded with them (assumed; replicated "
                "embeddings and uneven expert splits not modelled)")


def fraction(inp: PlanInput, name: str, default: tuple[float, str] | None) -> Term:
    """The engine's fraction: --fraction, else the release's default (``default``: value and where it is set)."""
    if inp.fraction is not None:
        return Term("mem_fraction_static", name, inp.fraction, inp.fraction, "", GIVEN, "--fraction")
    if default is None:
        raise PlanError(f"give --fraction ({name}): this release's default is not known to kvaudit")
    value, source = default
    return Term("mem_fraction_static", name, value, value, "", FORMULA, source)


def band(label: str, key: str, lo: float, hi: float, basis: str, kind: str = ASSUMED) -> Term:
    return Term(key, label, lo, hi, "GiB", kind, basis)


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


def concurrency(lo: int, hi: int, inp: PlanInput) -> tuple[int, int] | None:
    """Full-context requests the pool holds at once, at most --max-running-requests."""
    if not inp.context_length:
        return None
    c_lo, c_hi = lo // inp.context_length, hi // inp.context_length
    if inp.max_running_requests:
        c_lo, c_hi = min(c_lo, inp.max_running_requests), min(c_hi, inp.max_running_requests)
    return c_lo, c_hi


def replayed_cell(inp: PlanInput) -> int | None:
    """A startup replayed by --validate brings its own bytes per token (its log's); None otherwise."""
    if not inp.bytes_per_token:
        return None
    return round(sum(inp.bytes_per_token) / 2)


def kv_element(inp: PlanInput, aliases: dict[str, float] | None = None) -> float:
    """The KV element size in bytes: the model's dtype for "auto", else the engine's name for it."""
    from kvaudit.model_config import element_bytes

    assert inp.geometry is not None
    if inp.kv_dtype == "auto":
        return inp.geometry.dtype_bytes
    elt = (aliases or {}).get(inp.kv_dtype.lower()) or element_bytes(inp.kv_dtype)
    if elt is None:
        raise PlanError(f"--kv-dtype {inp.kv_dtype}: not a KV dtype kvaudit knows the size of")
    return elt


def pool_starts(budget: Interval, lo: int, hi: int, context: int | None, engine_error: str,
                context_fatal: bool) -> tuple[str, str]:
    """Whether a pool sized by a budget starts: ``engine_error`` is what the engine raises when the pool is empty
    (or, ``context_fatal``, cannot hold one request of the context length: vLLM checks max_model_len against its
    pool; the others shorten the session or queue the request)."""
    if budget.hi <= 0 or hi <= 0:
        return "no", f"the KV budget is not positive ({engine_error})"
    if context and hi < context:
        if context_fatal:
            return "no", f"the pool holds fewer tokens than one {context:,}-token request ({engine_error})"
        return "at risk", f"the pool holds fewer tokens than one {context:,}-token request"
    if budget.lo <= 0 or lo <= 0:
        return "at risk", "the KV budget is not positive at the low end of the interval (the assumed terms decide)"
    if context and lo < context:
        return "at risk", f"at the low end the pool holds fewer tokens than one {context:,}-token request"
    return "yes", "the KV budget is positive" + (" and holds one full-context request" if context else "")
