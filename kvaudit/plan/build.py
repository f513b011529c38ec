"""From the command line's words to a :class:`PlanInput`, and the plan of it by the engine's own plan function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.planning.model import Draft, ModelSizes, Observed, Plan, PlanInput, model_key
from kvaudit.record import record


@record
class PlanRequest:
    """The command line, as given."""

    engine: str  # "sglang==0.5.9"
    model: str  # a config.json or a model directory
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    tp: int = 1
    pp: int = 1
    dp_attention: int = 1
    fraction: float | None = None
    kv_dtype: str = "auto"
    context_length: int | None = None
    max_running_requests: int | None = None
    page_size: int | None = None
    max_total_tokens: int | None = None
    max_num_batched_tokens: int | None = None  # vLLM's --max-num-batched-tokens
    sampler: str | None = None  # vLLM V1: flashinfer | native (None: not known)
    #: settings that change the weights or where they live: the plan models none of them, and refuses them by name
    #: rather than planning as if they were not set
    dtype: str | None = None  # the engine's --dtype (auto, bfloat16, float16 are planned; float32 is not)
    quantization: str | None = None  # runtime quantization (--quantization fp8 on a bf16 checkpoint)
    cpu_offload_gib: float | None = None  # vLLM --cpu-offload-gb, SGLang --cpu-offload-gb
    history: str | None = None
    backend: str | None = None
    draft: str | None = None  # the draft model: a directory or its config.json
    speculative_algorithm: str | None = None
    post_capture_kv_sizing: bool = False  # SGLang 0.5.16+: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1


#: the speculative algorithms whose draft a plan sizes: a draft model of its own (NGRAM has none; NEXTN/MTP drafts
#: are the target checkpoint's own layers, not a plan input)
SPECULATIVE = ("EAGLE", "EAGLE3", "STANDALONE")


def _model_at(path_text: str, flag: str) -> tuple[Any, Any, Path]:
    """(geometry, weights or None, config path) of a model directory or config.json."""
    from kvaudit.model_config import load_config
    from kvaudit.plan.weights import model_weights

    path = Path(path_text).expanduser()
    directory = path if path.is_dir() else None
    config = path / "config.json" if directory else path
    if not config.is_file():
        raise KvauditError(f"{flag} {path_text}: no config.json there" if directory else
                           f"{flag} {path_text}: no such file")
    return load_config(config), (model_weights(directory) if directory else None), config


def _draft(req: PlanRequest) -> Draft | None:
    algorithm = (req.speculative_algorithm or ("EAGLE" if req.draft else "")).upper()
    if not algorithm:
        return None
    if algorithm not in SPECULATIVE:
        raise KvauditError(f"--speculative-algorithm {req.speculative_algorithm}: plan sizes {', '.join(SPECULATIVE)} "
                           "drafts (a draft model of its own)")
    if not req.draft:
        raise KvauditError(f"--speculative-algorithm {algorithm}: give the draft model (--draft DIR or config.json)")
    geom, weights, _ = _model_at(req.draft, "--draft")
    return Draft(algorithm, geom, weights.total_bytes if weights else None, weights.source if weights else None)


def plan_input(req: PlanRequest) -> PlanInput:
    from kvaudit.plan.cards import card

    name, sep, version = req.engine.partition("==")
    if not sep or not version:
        raise KvauditError(f"--engine {req.engine!r}: give the engine and its release, e.g. sglang==0.5.9 (each "
                           "release has its own rules)")
    geom, weights, config = _model_at(req.model, "MODEL")
    if req.gpu and req.gpu_memory_gib:
        raise KvauditError("give --gpu or --gpu-memory-gib, not both")
    if req.gpu:
        c = card(req.gpu)
        gpu_name, total_mib = c.name, float(c.total_mib)
    elif req.gpu_memory_gib:
        if not 1 <= req.gpu_memory_gib <= 4096:
            raise KvauditError(f"--gpu-memory-gib {req.gpu_memory_gib}: a card's memory in GiB (1-4096)")
        gpu_name, total_mib = None, req.gpu_memory_gib * 1024
    else:
        raise KvauditError("give the card: --gpu NAME (kvaudit plan --help lists them) or --gpu-memory-gib")
    for flag, v in (("--tp", req.tp), ("--pp", req.pp), ("--dp-attention", req.dp_attention)):
        if v < 1 or v > 4096:
            raise KvauditError(f"{flag} {v}: a number of GPUs (1-4096)")
    engine_name = name.strip().lower()
    if req.fraction is not None and not (0 < req.fraction < 1 or (req.fraction == 1 and engine_name == "vllm")):
        raise KvauditError(f"--fraction {req.fraction}: a fraction between 0 and 1" +
                           (" (1.0 is vLLM's alone)" if req.fraction == 1 else ""))
    not_modelled(req, geom)
    return PlanInput(name.strip().lower(), version.strip(), gpu_name, total_mib, req.tp, req.pp, req.dp_attention,
                     req.fraction, req.kv_dtype, req.context_length, req.max_running_requests, req.page_size,
                     req.max_total_tokens, geom, model_key(geom), weights.total_bytes if weights else None,
                     weights.source if weights else None, vocab_size=_vocab(config), backend=req.backend,
                     draft=_draft(req), sizes=model_sizes(config), max_num_batched_tokens=req.max_num_batched_tokens,
                     sampler=_sampler(req.sampler), post_capture=req.post_capture_kv_sizing)


def _vocab(config: Path) -> int | None:
    """config.json's vocab_size (or its text_config's); load_config has already bounded and parsed the file."""
    import json

    try:
        doc = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for d in (doc, doc.get("text_config") if isinstance(doc, dict) else None):
        v = d.get("vocab_size") if isinstance(d, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10**8:
            return v
    return None


#: what ``--dtype`` may say and still be planned: the checkpoint's own 16-bit type, or the engine's choice of it
SIXTEEN_BIT = ("auto", "bfloat16", "bf16", "float16", "fp16", "half")


def not_modelled(req: PlanRequest, geom: Any) -> None:
    """Settings the plan cannot size are refused by name ("not modelled"), never planned as if absent."""
    if req.dtype and req.dtype.lower() not in SIXTEEN_BIT:
        raise KvauditError(f"--dtype {req.dtype}: not modelled (the plan sizes 16-bit weights and activations; "
                           f"{req.dtype} changes both)")
    if req.dtype and req.dtype.lower() != "auto" and geom is not None and geom.dtype_bytes != 2:
        raise KvauditError(f"--dtype {req.dtype} over a {geom.torch_dtype} checkpoint: not modelled (the engine "
                           "converts the weights as it loads them; the checkpoint's bytes are not what it holds)")
    if req.quantization:
        raise KvauditError(f"--quantization {req.quantization}: not modelled (runtime quantization changes the "
                           "weights per rank and adds scales; plan the quantized checkpoint itself)")
    if req.cpu_offload_gib:
        raise KvauditError(f"--cpu-offload-gib {req.cpu_offload_gib:g}: not modelled (offloaded weights and the "
                           "buffers that stream them are not sized by plan)")


def _sampler(text: str | None) -> str | None:
    if text is None:
        return None
    if text.lower() not in ("flashinfer", "native"):
        raise KvauditError(f"--sampler {text!r}: flashinfer (the log says 'Using FlashInfer for top-p & top-k "
                           "sampling') or native (PyTorch's sort)")
    return text.lower()


def _positive(d: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10**8:
            return v
    return None


def model_sizes(config: Path) -> ModelSizes | None:
    """config.json's sizes (its text_config's, for a multimodal model): hidden, intermediate, one expert's
    intermediate and the experts a token is routed to, the vocabulary, and whether the lm_head is tied."""
    import json

    try:
        doc = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    text = doc.get("text_config")
    d = text if isinstance(text, dict) and _positive(text, "hidden_size") else doc
    tie = d.get("tie_word_embeddings", doc.get("tie_word_embeddings", False))
    rope = d.get("rope_scaling") or doc.get("rope_scaling")
    factor = None
    if isinstance(rope, dict):
        kind = str(rope.get("rope_type") or rope.get("type") or "")
        f = rope.get("factor")
        if kind not in ("llama3", "default", "mrope") and isinstance(f, (int, float)) and not isinstance(f, bool) \
                and 1 < f < 1000:
            factor = float(f)
    return ModelSizes(_positive(d, "hidden_size", "d_model", "n_embd"),
                      _positive(d, "intermediate_size", "ffn_hidden_size", "n_inner"),
                      _positive(d, "moe_intermediate_size", "expert_intermediate_size"),
                      _positive(d, "num_experts_per_tok", "moe_topk", "num_experts_per_token"),
                      _positive(d, "vocab_size") or _positive(doc, "vocab_size"), tie is True, factor,
                      _quant_method(doc), _positive(d, "num_local_experts", "num_experts", "n_routed_experts"),
                      _positive(d, "num_hidden_layers", "n_layer", "num_layers"))


def _quant_method(doc: dict[str, Any]) -> str | None:
    q = doc.get("quantization_config")
    method = q.get("quant_method") if isinstance(q, dict) else None
    return method.lower()[:32] if isinstance(method, str) and method.isprintable() else None


def history_frame(rows: list[Observed] | None) -> Any:
    """The recorded startups (read by the command layer, kvaudit.plan_inputs) as the calibration's frame."""
    if not rows:
        return None
    from kvaudit.planning.calibrate import frame

    return frame(rows)


def run(req: PlanRequest, history: list[Observed] | None = None) -> Plan:
    """The plan of ``req``; ``history``: the startups of ``req.history`` (kvaudit.plan_inputs.history_rows)."""
    from kvaudit.engines import by_name

    inp = plan_input(req)
    try:
        engine = by_name(inp.engine)
    except KeyError:
        engine = None
    if engine is None or engine.plan is None:
        raise KvauditError(f"--engine {inp.engine}: kvaudit plan sizes "
                           f"{', '.join(e.name for e in planned_engines())} deployments in this version")
    return structural(engine.plan(inp, history_frame(history)))


#: environment overrides that let an engine start past the model's own context (not plan inputs: said in the reason)
LONG_CONTEXT_OVERRIDE = {"vllm": "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                         "sglang": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"}


def structural(p: Plan) -> Plan:
    """What stops an engine before any memory is measured, for every engine: a TP size that does not divide the
    attention heads (or the KV heads, which are split or replicated), and a context length past the one the model
    derives. Each is ``no`` with the term that decides it; a memory verdict stays in the reason after it."""
    import dataclasses

    inp, geom = p.input, p.input.geometry
    why = None
    layout = False  # a TP the heads cannot split: the layout does not exist, and nothing of it is sized
    if geom is not None and geom.num_attention_heads and geom.num_attention_heads % inp.tp:
        layout = True
        why = (f"--tp {inp.tp} does not divide the model's {geom.num_attention_heads} attention heads: the engine "
               "refuses to start (vLLM ModelConfig.verify_with_parallel_config: 'Total number of attention heads ... "
               "must be divisible by tensor parallel size'; SGLang and TensorRT-LLM split heads the same way)")
    elif (geom is not None and geom.num_kv_heads and not geom.is_mla
          and geom.num_kv_heads % inp.tp and inp.tp % geom.num_kv_heads):
        layout = True
        why = (f"--tp {inp.tp} neither divides the model's {geom.num_kv_heads} KV heads nor is a multiple of them: "
               "they can be neither split nor replicated evenly, and the engine refuses to start")
    elif geom is not None and inp.context_length and geom.max_position_embeddings:
        factor = inp.sizes.rope_factor if inp.sizes is not None and inp.sizes.rope_factor else 1.0
        derived = int(geom.max_position_embeddings * factor)
        if inp.context_length > derived:
            override = LONG_CONTEXT_OVERRIDE.get(inp.engine)
            words = (f"the context length {inp.context_length:,} is past the model's {derived:,} "
                     f"(max_position_embeddings{f' x rope factor {factor:g}' if factor != 1 else ''})")
            if override:
                why = f"{words}: {inp.engine} refuses it unless {override} is set"
            elif p.starts == "yes":
                return dataclasses.replace(p, starts="at risk", starts_reason=f"{words}; {p.starts_reason}")
    if why is None:
        return p
    if layout:
        # the engine stops at the split, before it measures any memory: per-rank weights, a cell of "8 KV heads / 3",
        # tokens and fractions would size a deployment that cannot exist. Only the card's own terms stay.
        card_terms = tuple(t for t in p.terms if t.key in ("t_gib", "mem_fraction_static"))
        return dataclasses.replace(p, terms=card_terms, tokens_low=0, tokens_high=0, kv_gib_low=0.0, kv_gib_high=0.0,
                                   concurrency=None, left_after_graphs=None, smallest_fraction=None,
                                   largest_fraction=None, starts="no", starts_reason=why,
                                   rule="not sized: the engine refuses this TP before it sizes any memory")
    return dataclasses.replace(p, starts="no", starts_reason=why + (f"; and {p.starts_reason}" if p.starts == "no"
                                                                    else ""))


#: plan's exit status by its word on starting (docs/plan.md, "Exit status"): a `no` is never a silent 0
EXIT_BY_STARTS = {"yes": 0, "at risk": 1, "unknown": 1, "no": 3}


def exit_status(p: Plan) -> int:
    """0 when the plan says it starts; 1 (WARNINGS) when it may not, or cannot say; 3 (LOG_ERRORS, as for a log
    whose startup failed) when it says the deployment will not start. Bad input is 2, as everywhere."""
    return EXIT_BY_STARTS.get(p.starts, 1)


def planned_engines() -> list[Any]:
    """The engines whose deployments kvaudit plans (their formula package has ``plan``)."""
    from kvaudit.engines import ENGINES

    return [e for e in ENGINES if e.plan is not None]


__all__ = ["PlanRequest", "plan_input", "planned_engines", "run"]
