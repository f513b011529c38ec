"""From the command line's words to a :class:`PlanInput`, and the plan of it by the engine's own plan function."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.planning.model import Draft, ModelSizes, Observed, Plan, PlanInput, model_key


@dataclass(frozen=True)
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
    history: str | None = None
    backend: str | None = None
    draft: str | None = None  # the draft model: a directory or its config.json
    speculative_algorithm: str | None = None


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
    geom, weights, config = _model_at(req.model, "--model")
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
    if req.fraction is not None and not 0 < req.fraction < 1:
        raise KvauditError(f"--fraction {req.fraction}: a fraction between 0 and 1")
    return PlanInput(name.strip().lower(), version.strip(), gpu_name, total_mib, req.tp, req.pp, req.dp_attention,
                     req.fraction, req.kv_dtype, req.context_length, req.max_running_requests, req.page_size,
                     req.max_total_tokens, geom, model_key(geom), weights.total_bytes if weights else None,
                     weights.source if weights else None, vocab_size=_vocab(config), backend=req.backend,
                     draft=_draft(req), sizes=model_sizes(config), max_num_batched_tokens=req.max_num_batched_tokens,
                     sampler=_sampler(req.sampler))


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
    return ModelSizes(_positive(d, "hidden_size", "d_model", "n_embd"),
                      _positive(d, "intermediate_size", "ffn_hidden_size", "n_inner"),
                      _positive(d, "moe_intermediate_size", "expert_intermediate_size"),
                      _positive(d, "num_experts_per_tok", "moe_topk", "num_experts_per_token"),
                      _positive(d, "vocab_size") or _positive(doc, "vocab_size"), tie is True)


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
    return engine.plan(inp, history_frame(history))


def planned_engines() -> list[Any]:
    """The engines whose deployments kvaudit plans (their formula package has ``plan``)."""
    from kvaudit.engines import ENGINES

    return [e for e in ENGINES if e.plan is not None]


__all__ = ["PlanRequest", "plan_input", "planned_engines", "run"]
