"""The terms of a plan that no formula gives, observed in the fleet's own startups (pandas over the history).

A *family* is the startups that share what a term depends on. T (free memory before the weights) depends on the
card, the engine's release (its CUDA context, NCCL and warm-up before it measures) and the TP size; the free
memory after the weights and what the reserve held also depend on the model. Each term is taken from the nearest
family that has startups: the same card, release and TP (and model, where the term depends on it) first, then the
same card and TP at other releases (kept apart and said so: a term that moved across releases is not averaged
into this one's), then the same card at any TP. The interval is the observed range, widened for each step away
from the family, and for the logs' rounding (+-0.005 GiB per logged value).
"""

from __future__ import annotations

from typing import Any, Callable

from kvaudit.record import record
from kvaudit.planning.model import Observed, PlanInput

#: a logged GiB value is rounded to two decimals
HALF_ULP = 0.005
#: how much wider a term taken from another release, or from another TP size, is made (GiB): what the releases and
#: TP sizes in the corpus moved T by (docs/plan.md, "Calibration")
OTHER_RELEASE_GIB = 0.25
OTHER_TP_GIB = 0.5
#: how much one deployment's terms move between restarts on the same discrete card (GiB), which a family of ONE
#: startup cannot show: measured on the repeated startups of the corpus and of llm-d's published runs (docs/plan.md,
#: "Run-to-run spread"): T equal to the digit over 9 SGLang startups of 5 checkpoints on one 2x RTX 3090 host
#: (22.91, sglang_c002/c004/c012/c016-c021) and over vLLM 0.6.4's two RTX 3090 startups (23.58, vllm_c014/c015);
#: the weights equal to the digit over 2-3 loads of 4 checkpoints there and of 3 on llm-d's H100 (Qwen3-0.6B 1.12,
#: Qwen3-32B 61.03, Llama-3.1-8B's 14.99 vs vllm_c014's 14.9888); vLLM's activation + non-torch equal over llm-d's
#: repeated runs (5.56 + 0.13, 5.64 + 0.14); llm-d's free memory at start 78.57 GiB in 10 startups and 78.59 in
#: one (of 79.18 / 79.19): 0.02 GiB, the largest move seen. Unified-memory machines move far more (GB10: T by 0.34,
#: one checkpoint's load by 0.58 GiB) and are not planned.
RUN_TO_RUN_GIB = 0.02


@record
class Observation:
    lo: float
    hi: float
    n: int
    basis: str
    level: int = 0  # 0: this family; 1: other releases; 2: other numbers of ranks


def release_of(version: Any) -> Any:
    """A release as the history should file it: a local build's suffix dropped ("0.5.11+05fb6a52" is 0.5.11, as
    PEP 440 reads a local version label); a range ("0.5.10..0.5.12") or None as it is."""
    if not isinstance(version, str):
        return version
    return version.split("+", 1)[0].strip() or version


def frame(rows: list[Observed]) -> Any:
    import pandas as pd  # type: ignore[import-untyped]  # no stubs in the test environment

    df = pd.DataFrame([r.__dict__ for r in rows], columns=list(Observed.__dataclass_fields__))
    df["version"] = df["version"].map(release_of)
    return df


def _same_card(df: Any, inp: PlanInput) -> Any:
    if inp.card:
        return df[df["gpu_name"].fillna("").str.lower() == inp.card.lower()]
    if not inp.gpu_total_mib:  # a replayed log whose card is not known: its card is not known either
        return df[df["gpu_total_mib"].isna() & df["gpu_name"].isna()]
    return df[(df["gpu_total_mib"] - inp.gpu_total_mib).abs() <= 1]


def _describe(sub: Any, what: str) -> str:
    hosts = sorted(set(sub["host"]))
    shown = ", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3 else "")
    return f"{len(sub)} startup{'s' if len(sub) != 1 else ''} of {what} ({shown})"


def observe(df: Any, inp: PlanInput, value: Callable[[Any], Any], by_model: bool,
            ranks_scale: str = "no") -> Observation | None:
    """The term ``value(rows)`` from the nearest family that has it; None when no startup has it. A startup at
    another number of ranks gives a term that splits over the ranks (``ranks_scale="split"``: the weights) scaled
    by its ranks / ours; one that does not depend on them (``"no"``: T) as it is; one that mixes both
    (``"skip"``: post = T - weights) is not taken from other numbers of ranks at all."""
    if df is None or len(df) == 0:
        return None
    card = _same_card(df[df["engine"] == inp.engine], inp)
    if by_model:
        card = card[card["model_key"] == inp.model_key]
    card_name = inp.card or f"a {inp.gpu_total_mib:,.0f} MiB card"
    ranks = inp.tp * inp.pp  # the history counts ranks
    version = release_of(inp.version)
    model = f" with this model ({inp.model_key})" if by_model else ""
    steps = (
        (card[(card["version"] == version) & (card["tp"] == ranks)], 0.0,
         f"{card_name}, {inp.engine} {inp.version}, {ranks} ranks{model}"),
        (card[(card["version"] != version) & (card["tp"] == ranks)], OTHER_RELEASE_GIB,
         f"{card_name}, {ranks} ranks{model} at other {inp.engine} releases"),
        (card[card["tp"] != ranks], OTHER_RELEASE_GIB + OTHER_TP_GIB, f"{card_name}{model} at other numbers of ranks"),
    )
    for level, (sub, widen, what) in enumerate(steps):
        if level == 2 and ranks_scale == "skip":
            break
        vals = value(sub).dropna() if len(sub) else None
        if vals is not None and level == 2 and ranks_scale == "split":
            vals = vals * sub.loc[vals.index, "tp"] / ranks  # the weights split over the ranks
            what += f", scaled by their ranks / {ranks}"
        if vals is None or len(vals) == 0:
            continue
        used = sub.loc[vals.index]
        lo, hi = float(vals.min()), float(vals.max())
        spread = f"spread {hi - lo:.3f} GiB" if len(vals) > 1 else (
            f"one startup: widened by the run-to-run spread of one deployment ({RUN_TO_RUN_GIB} GiB)")
        if len(vals) == 1:
            lo, hi = lo - RUN_TO_RUN_GIB, hi + RUN_TO_RUN_GIB
        versions = sorted(set(used["version"].dropna()))
        kept = f"; releases {', '.join(versions)}" if widen and versions else ""
        return Observation(lo - HALF_ULP - widen, hi + HALF_ULP + widen, len(vals),
                           f"{_describe(used, what)}; {spread}{kept}" + (f"; widened by {widen:g} GiB" if widen
                                                                            else ""), level)
    return None


def pre_load_free(df: Any, inp: PlanInput) -> Observation | None:
    return observe(df, inp, lambda s: s["t_gib"], by_model=False)


def post_load_free(df: Any, inp: PlanInput) -> Observation | None:
    """post = T - weights mixes a term of the card and one of the ranks: not taken from other numbers of ranks
    (the plan then takes T and the scaled weights apart)."""
    return observe(df, inp, lambda s: s["post_gib"], by_model=True, ranks_scale="skip")


def weight_memory(df: Any, inp: PlanInput) -> Observation | None:
    """T - post for this model, at this TP: what loading it took (SGLang: the weights and what comes with them), or
    what TensorRT-LLM's profiling run left in use besides the temporary KV (its post is free after profiling)."""
    return observe(df, inp, lambda s: s["t_gib"] - s["post_gib"], by_model=True, ranks_scale="split")


def logged_weights(df: Any, inp: PlanInput) -> Observation | None:
    """What loading this model took per rank as the engine logged it (vLLM's "Model loading took X GiB"): the
    engines whose T is the card's total, where T - post is not the weights."""
    return observe(df, inp, lambda s: s["weights_gib"], by_model=True, ranks_scale="split")


def budget_besides_weights(df: Any, inp: PlanInput) -> Observation | None:
    """vLLM: what the budget (total x util) held besides the weights and the KV cache (activation peak, non-torch
    memory, the CUDA-graph estimate): total x util - weights - the available KV memory it logged."""
    return observe(df, inp, lambda s: s["t_gib"] * s["fraction"] - s["weights_gib"] - s["rest_gib"], by_model=True,
                   ranks_scale="skip")  # activations split over TP, non-torch grows with ranks: kept apart


def reserve_held(df: Any, inp: PlanInput) -> Observation | None:
    """What the reserve held at startup (graphs, activations, a draft, the request table): reserve - free at end."""
    return observe(df, inp, lambda s: s["reserve_gib"] - s["free_at_end_gib"], by_model=True)
