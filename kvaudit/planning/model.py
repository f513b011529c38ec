"""What a plan asks and answers: frozen values the engine's plan function, the calibration and the reports share.

Every number a plan prints is a :class:`Term` with its kind: **calibrated** (observed in the fleet's own startups:
which, how many, their spread), **formula** (the engine's own arithmetic on given inputs), **assumed** (a default,
with the range it may take), **default** (the release's own value of a setting not given, e.g. the fraction), or
**given** (the command line). An interval is the range the inputs allow: narrow
when they were observed, wide when they are assumed.
"""

from __future__ import annotations


from kvaudit.model_config import ModelGeometry
from kvaudit.record import record

CALIBRATED, FORMULA, ASSUMED, GIVEN = "calibrated", "formula", "assumed", "given"
#: the release's own value of a setting the command line did not give (the fraction): exact, as a formula's term
#: is, but not the user's, so it is not labelled "formula" (nothing was computed) nor "given"
DEFAULT = "default"


def model_key(geom: ModelGeometry) -> str:
    """What tells a model apart in the history without its name: architecture, layers, KV heads and head size."""
    return (f"{geom.architecture or 'unknown'}/{geom.num_layers}L/{geom.num_kv_heads or 0}kv/"
            f"{geom.kv_lora_rank or geom.head_dim or 0}d")


@record
class Term:
    key: str  # stable: t_gib, weights_gib, post_load_free_gib, reserve_gib, rest_gib, bytes_per_token, ...
    label: str
    lo: float
    hi: float
    unit: str  # "GiB", "B" (bytes per token), "" (a fraction)
    kind: str  # calibrated | formula | assumed | given
    basis: str  # where it comes from, in words

    @property
    def mid(self) -> float:
        return (self.lo + self.hi) / 2

    @property
    def exact(self) -> bool:
        return self.lo == self.hi


@record
class Draft:
    """A speculative draft model: its algorithm, its config's geometry and its checkpoint's bytes (None: not read)."""

    algorithm: str  # EAGLE | EAGLE3 | STANDALONE
    geometry: ModelGeometry
    weight_bytes: int | None
    weight_source: str | None

    @property
    def layers(self) -> int:
        """L_draft as SGLang counts it: num_nextn_predict_layers, else the draft's own layers."""
        return self.geometry.num_nextn_predict_layers or self.geometry.num_layers


@record
class ModelSizes:
    """The config.json sizes that the engines' profiling runs scale with (vLLM's dummy batch through the model and
    its sampler over the vocabulary), and that tell a tied lm_head; None where the config does not say."""

    hidden_size: int | None = None
    intermediate_size: int | None = None  # a dense MLP's; a MoE model's shared or dense layers
    moe_intermediate_size: int | None = None  # one expert's
    experts_per_token: int | None = None  # num_experts_per_tok / moe_topk
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    #: rope_scaling's factor when it lengthens the context the engines derive (yarn, dynamic, linear...); None for
    #: none, or for Llama-3's "llama3" type, whose max_position_embeddings already states the long context
    rope_factor: float | None = None
    #: quantization_config's quant_method ("mxfp4", "fp8"...), and the routed experts' count and layers: what an
    #: engine re-lays out at load (vLLM pads MXFP4 experts per kernel backend)
    quant_method: str | None = None
    num_experts: int | None = None
    num_layers: int | None = None


@record
class PlanInput:
    engine: str
    version: str  # one release, "0.5.9"
    card: str | None  # nvidia-smi's name of the card, when it was named
    gpu_total_mib: float  # nvidia-smi memory.total of one card
    tp: int
    pp: int
    dp_attention: int
    fraction: float | None  # None: the engine's default for this card and TP
    kv_dtype: str  # "auto" or the engine's name for it
    context_length: int | None
    max_running_requests: int | None
    page_size: int | None
    max_total_tokens: int | None
    geometry: ModelGeometry | None  # None only when the bytes per token are given (a validation replays a startup)
    model_key: str  # what tells two startups of the same model apart in the history
    weight_bytes: int | None
    weight_source: str | None
    #: a startup replayed by --validate: its own bytes per token, and its T when its card is not known (a log)
    bytes_per_token: tuple[float, float] | None = None
    given_t: tuple[float, float] | None = None
    vocab_size: int | None = None  # config.json's, for LMDeploy's PyTorch-engine runtime estimate
    backend: str | None = None  # LMDeploy: turbomind (the default) or pytorch
    draft: Draft | None = None
    sizes: ModelSizes | None = None  # config.json's hidden, intermediate, vocabulary sizes
    #: vLLM's max_num_batched_tokens (None: the release's default for the card and max_model_len)
    max_num_batched_tokens: int | None = None
    #: vLLM V1's top-k/top-p sampler: "flashinfer" (FlashInfer installed: the log's "Using FlashInfer for top-p &
    #: top-k sampling"), "native" (PyTorch's sort), None: not known (the profile run's peak is either)
    sampler: str | None = None
    #: SGLang 0.5.16+: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is set (its default fraction skips the graph reserve)
    post_capture: bool = False
    #: a replayed startup's sign of AMD ROCm (kvaudit.reconcile.interface.Audit.rocm): a log names no card, so the
    #: platform comes from its lines (None: no sign; the card's name still tells an AMD card)
    rocm: str | None = None


@record
class Plan:
    input: PlanInput
    terms: tuple[Term, ...]
    tokens_low: int
    tokens_high: int
    kv_gib_low: float
    kv_gib_high: float
    #: full-context requests the pool holds at once (low, high), at most --max-running-requests
    concurrency: tuple[int, int] | None
    left_after_graphs: Term | None  # what the reserve leaves once graphs, activations, a draft have taken theirs
    starts: str  # "yes" | "no" | "at risk" | "unknown"
    starts_reason: str
    smallest_fraction: float | None  # the smallest fraction whose pool holds one full-context request
    largest_fraction: float | None  # the largest that still leaves the reserve what it held (calibrated only)
    rule: str
    notes: tuple[str, ...] = ()
    block_size: int = 1  # the page (SGLang), block (vLLM, LMDeploy) or tokens per block (TensorRT-LLM)
    #: what bounds the largest fraction, where the engine's rule is not SGLang's reserve
    largest_fraction_reason: str = "the largest that still leaves the reserve what it held before"


@record
class Observed:
    """One startup's terms as the history keeps them (``kvaudit.fleet.history`` table ``startups``)."""

    run_id: int
    host: str
    engine: str
    version: str | None
    gpu_name: str | None
    gpu_total_mib: float | None
    tp: int | None
    fraction: float | None
    t_gib: float | None
    post_gib: float | None
    weights_gib: float | None
    reserve_gib: float | None
    free_at_end_gib: float | None
    bytes_per_token: int | None
    tokens: int | None
    model_key: str | None
    bpt_low: float | None = None
    bpt_high: float | None = None
    page_size: int | None = None
    rest_gib: float | None = None  # the KV budget the engine computed (SGLang's rest, vLLM's available KV memory)
    #: the audit's sign of AMD ROCm (Audit.rocm) of a startup replayed from a log; not kept in the history (its
    #: startups carry their card's name)
    rocm: str | None = None
