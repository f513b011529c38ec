"""The SGLang formula and ledger, scenario by scenario (engine-version eras parametrised where they differ).

Oracles are independent of kvaudit's code: the worked numbers of the shared reference (section 7) and the
formula written out again here in its plainest form."""

from __future__ import annotations

import io
import math

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Thresholds
from tests.conftest import CONFIGS, KIMI_CONFIG, KIMI_LOG

GIB = 2**30
KIMI = load_config(KIMI_CONFIG)


def run(text: str, **opts):
    opts.setdefault("model_geometry", KIMI)
    (a,) = audit(read_log(io.BytesIO(text.encode())), AuditOptions(**opts))
    return a


def kimi(**replace: str) -> str:
    text = KIMI_LOG.read_bytes().decode()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def oracle(post: float, T: float, mfs: float, cell: float) -> tuple[int, int]:
    """floor((post - (1 - mfs) T) 2^30 / cell) over the rounding of the two logged values."""
    lo = math.floor(((post - 0.005) - (1 - mfs) * (T + 0.005)) * GIB / cell)
    hi = math.floor(((post + 0.005) - (1 - mfs) * (T - 0.005)) * GIB / cell)
    return lo, hi


def test_kimi_scenario():
    a = run(kimi())
    f = a.formula
    assert f.pre_load_free_gib == 94.01 and f.post_load_free_gib == 21.71
    assert f.reserve_gib == pytest.approx(11.28, abs=0.005)
    assert f.bytes_per_token == 70272 and f.bytes_per_token_source == "config"
    assert f.predicted_tokens.low <= 159277 <= f.predicted_tokens.high
    # the reference's interval (post rounding only) lies inside ours (post and T rounding)
    assert f.predicted_tokens.low <= 159273 and f.predicted_tokens.high >= 159426
    assert f.verdict.value == "match"
    assert a.engine_version == "0.5.9" and a.speculative == "EAGLE3"
    reserve = next(x for x in a.findings if x.code == "RESERVE_EXPLAINS_FREE")
    assert "11.18" in reserve.message and reserve.fields["free_after_pool_gib"] == 11.18
    assert len(reserve.ranks) == 8


def test_kimi_ledger_adds_up_on_every_gpu():
    a = run(kimi())
    assert len(a.ranks) == 8
    for r in a.ranks:
        total = sum(i.gib for i in r.items) + r.free_at_end_gib + r.unexplained_gib
        assert total == pytest.approx(r.pre_load_free_gib, abs=0.002)
        assert abs(r.unexplained_gib) <= r.unexplained_tolerance_gib
    tp0 = a.ranks[0]
    assert tp0.item("request_table").gib == pytest.approx(48 * (262144 + 4 + 4) * 4 / GIB, abs=0.002)
    assert tp0.item("draft_weights").gib == 1.55 and tp0.item("draft_weights").in_reserve
    assert tp0.free_at_end_gib == 6.93 and tp0.end_is_final


def test_capacity_reading_of_T_does_not_match():
    """Reference 7: taking T as the card's 95.59 GiB predicts 156,376..156,529, not 159,277."""
    a = run(kimi(**{"Load weight begin. avail mem=94.01 GB": "Load weight begin. avail mem=95.59 GB",
                    "Load weight begin. avail mem=94.03 GB": "Load weight begin. avail mem=95.61 GB"}))
    f = a.formula
    assert f.verdict.value == "mismatch"
    assert f.predicted_tokens.high < 159277
    assert abs(f.predicted_tokens.low - 156376) < 100 and abs(f.predicted_tokens.high - 156529) < 100
    assert f.effective_mem_fraction_static == pytest.approx(1 - (21.71 - 159277 * 70272 / GIB) / 95.59, abs=1e-3)
    assert any(x.code == "TOKENS_MISMATCH" for x in a.findings)


def _era_log(fmt: str, post: float, T: float, tokens: int, extra_args: str = "", kv_gb: str = "10.42") -> str:
    """A one-rank startup in the line formats of one era."""
    begin = f"[2025-06-01 10:00:00 TP0] Load weight begin. avail mem={T:.2f} GB\n"
    if fmt == "0.4.4":
        end = f"[2025-06-01 10:00:01 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem={post:.2f} GB, mem usage={T - post:.2f} GB.\n"
        kv = f"[2025-06-01 10:00:02 TP0] KV Cache is allocated. #tokens: {tokens}, KV size: {kv_gb} GB\n"
    elif fmt == "0.5.14":
        end = f"[2026-07-01 10:00:01 TP0] Load weight end. elapsed=10.00 s, type=DeepseekV3ForCausalLM, quant=fp8, avail mem={post:.2f} GB, mem usage={T - post:.2f} GB.\n"
        kv = (f"[2026-07-01 10:00:02 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, KV size: {kv_gb} GB\n"
              "[2026-07-01 10:00:03 TP0] Capture target decode CUDA graph begin. backend=fa3, num_tokens_per_bs=4, bs=[1], avail mem=2.00 GB\n")
    else:
        raise ValueError(fmt)
    args = f"[2025-06-01 09:59:59] server_args=ServerArgs(mem_fraction_static=0.88, tp_size=1, page_size=1{extra_args})\n"
    return args + begin + end + kv


def test_eagle_headroom_0_4_4_to_0_5_6():
    lo, hi = oracle(21.71, 94.01, 0.88, 70272)
    head = 48 * 3 * 1 + 48 * 4 + 100
    tokens = lo + head + 20
    text = _era_log("0.4.4", 21.71, 94.01, tokens,
                    ", speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1, "
                    "speculative_num_draft_tokens=4, max_running_requests=48",
                    kv_gb=f"{(tokens + 1) * 70272 / GIB:.2f}")  # the pool holds the inflated count
    f = run(text).formula
    assert f.speculative_headroom_tokens == head
    assert (f.predicted_tokens.low, f.predicted_tokens.high) == (lo + head, hi + head)
    assert f.verdict.value == "match"


def test_draft_layers_inflate_the_cell_from_0_5_14():
    """Reference 7: under the 0.5.14 rule (draft 1.55 GB loaded first, cell x 62/61) Kimi gets ~133,500."""
    post = 21.71 - 1.55
    lo, hi = oracle(post, 94.01, 0.88, 70272 * (1 + 1 / 61))
    assert abs(lo - 133500) < 200
    text = _era_log("0.5.14", post, 94.01, lo + 10, ", speculative_algorithm='EAGLE3'", kv_gb=f"{(lo + 11) * 70272 / GIB:.2f}")
    a = run(text)
    assert a.engine_version.startswith("0.5.14") or a.engine_version.startswith(">=0.5.14")
    f = a.formula
    assert (f.predicted_tokens.low, f.predicted_tokens.high) == (lo, hi)
    assert f.verdict.value == "match" and "draft weights loaded first" in f.rule


def test_page_rounding_and_cap():
    lo, hi = oracle(21.71, 94.01, 0.88, 70272)
    text = _era_log("0.4.4", 21.71, 94.01, lo // 64 * 64, ", page_size=64").replace("page_size=1, page_size=64", "page_size=64")
    f = run(text).formula
    assert f.page_size == 64
    assert f.predicted_tokens.low % 64 == 0 and f.predicted_tokens.high % 64 == 0
    capped = run(_era_log("0.4.4", 21.71, 94.01, 10000, ", max_total_tokens=10000", kv_gb="0.65"))
    assert capped.formula.verdict.value == "match"
    assert capped.formula.predicted_tokens.high == 10000
    assert any(x.code == "TOKENS_CAPPED" for x in capped.findings)


def test_missing_fraction_is_inferred_and_then_checked_by_the_user():
    """sglang_017 has no server_args: the fraction is inferred (verdict unknown, not a circular 'match'),
    and the value a user then passes reproduces the logged tokens."""
    from tests.conftest import SAMPLES

    text = (SAMPLES / "sglang_017.log").read_bytes().decode()
    a = run(text, model_geometry=None)
    assert a.formula.mem_fraction_static_source == "inferred" and a.formula.verdict.value == "unknown"
    inferred = a.formula.mem_fraction_static
    b = run(text, model_geometry=None, mem_fraction_static=round(inferred, 3))
    assert b.formula.mem_fraction_static_source == "cli"
    assert b.formula.verdict.value == "match"


def test_geometry_mismatch_falls_back_to_the_kv_line():
    from tests.conftest import SAMPLES

    a = run((SAMPLES / "sglang_029.log").read_bytes().decode(), model_geometry=load_config(CONFIGS / "llama3-8b.json"))
    gm = next(x for x in a.findings if x.code == "GEOMETRY_MISMATCH")
    assert gm.fields["config_bytes_per_token"] == 131072
    assert a.formula.bytes_per_token_source.startswith("kv_line")
    assert a.formula.verdict.value == "match"


def test_low_headroom_and_thresholds():
    a = run(kimi(**{"available_gpu_mem=6.93 GB": "available_gpu_mem=0.40 GB"}))
    assert any(x.code == "LOW_HEADROOM" for x in a.findings)
    assert not any(x.code == "UNUSED_MEMORY" for x in run(kimi()).findings)
    strict = run(kimi(), thresholds=Thresholds(unused_fraction=0.05))
    unused = next(x for x in strict.findings if x.code == "UNUSED_MEMORY")
    assert unused.fields["idle_gib"] == 6.93


def test_rank_imbalance_from_pre_load_memory():
    text = kimi(**{"[2026-02-25 10:12:22 TP6] Load weight begin. avail mem=94.01 GB":
                   "[2026-02-25 10:12:22 TP6] Load weight begin. avail mem=91.01 GB"})
    ri = next(x for x in run(text).findings if x.code == "RANK_IMBALANCE")
    assert ri.fields["min_rank"] == "TP6" and ri.fields["spread_gib"] == pytest.approx(3.02)


@pytest.mark.parametrize("line,code", [
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
     "Current value: self.server_args.mem_fraction_static=0.88", "NOT_ENOUGH_MEMORY"),
    ("[2026-02-25 10:16:41 TP0] max_total_tokens=200000 is larger than the profiled value -1234. "
     "Use the profiled value instead.", "NOT_ENOUGH_MEMORY"),
    ("[2026-02-25 10:12:20 TP3] The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
     "min_per_gpu_memory=60.12, local_gpu_memory=78.50, local_gpu_memory * 0.9=70.65", "RANK_IMBALANCE"),
])
def test_failures_are_errors(line, code):
    head = "\n".join(KIMI_LOG.read_bytes().decode().split("\n")[:40])
    a = run(head + "\n" + line + "\n")
    hit = [x for x in a.findings if x.code == code and x.severity.value == "error"]
    assert hit, [x.code for x in a.findings]
    assert any(x.code == "STARTUP_FAILED" for x in a.findings) or code == "NOT_ENOUGH_MEMORY"


def test_a_kv_size_that_rounds_to_zero_gives_no_bytes_per_token():
    """Found by a long hypothesis run: 'K size: 0.00 GB' bounded bytes per token by 0 and the what-if divided by it."""
    from tests.conftest import cli

    text = ("[2026-01-01 10:00:00 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=7.73 GB, mem usage=1.55 GB.\n"
            "[2026-01-01 10:00:01 TP0] KV Cache is allocated. #tokens: 1, K size: 0.00 GB, V size: 0.00 GB\n")
    a = run(text, model_geometry=None, mem_fraction_static=0.88)
    assert a.formula.bytes_per_token is None and a.formula.verdict.value == "unknown"
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as fh:
        fh.write(text)
    r = cli("whatif", fh.name, "--mem-fraction-static", "0.9", "--log-mem-fraction-static", "0.88")
    assert r.code in (0, 1) and "internal error" not in r.stderr
