"""kvaudit diff (issue 25): two startups side by side, and which terms of the formula moved the KV tokens. The
B startup is the bundled Kimi-K2.5 startup with 1.00 GiB more taken by the weights on every rank (an upgrade
that loads more), its pool the count the engine's formula gives then."""

from __future__ import annotations

import io
import re

from kvaudit.diff import diff
from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, cli

GIB = 2 ** 30


def _heavier(text: str, tokens: int | None = None) -> str:
    def weights(m: re.Match) -> str:
        return f"avail mem={float(m.group(1)) - 1:.2f} GB, mem usage={float(m.group(2)) + 1:.2f} GB."

    text = re.sub(r"avail mem=([\d.]+) GB, mem usage=([\d.]+) GB\.(?=$)", weights, text, flags=re.M)
    if tokens is not None:  # the pool's lines as the engine prints them for that count (KV size in GiB, 2 places)
        text = text.replace("#tokens: 159277, KV size: 10.42 GB",
                            f"#tokens: {tokens}, KV size: {10.42 * tokens / 159277:.2f} GB").replace(
            "max_total_num_tokens=159277", f"max_total_num_tokens={tokens}")
    return text


def _audit(text: str):
    opts = AuditOptions(model_geometry=load_config(KIMI_CONFIG))
    return audit(read_log(io.BytesIO(text.encode())), opts)[-1]


def test_heavier_weights_are_named_as_the_cause_of_fewer_tokens(tmp_path):
    real = KIMI_LOG.read_text()
    probe = _audit(_heavier(real))  # the formula's count with the heavier weights
    tokens = probe.formula.predicted_tokens.low
    a, b = _audit(real), _audit(_heavier(real, tokens))
    assert b.formula.verdict.value == "match" and tokens < 159277
    d = diff(a, b, "before", "after")
    assert d.tokens_change == tokens - 159277
    load = next(s for s in d.shares if s.key == "load")
    expected = -GIB / a.formula.bytes_per_token  # 1 GiB less KV budget at 70,272 B per token
    assert abs(load.tokens - expected) < 0.01 * abs(expected), (load, expected)
    assert "took 1.00 GiB more (the weights on TP0: +1.00 GiB)" in load.says
    assert {s.key for s in d.shares} == {"load"}  # T, the fraction and the cell did not move
    # what is left is the log's rounding (each GiB figure is printed to 0.01: the predicted intervals' width)
    slack = sum(x.formula.predicted_tokens.high - x.formula.predicted_tokens.low for x in (a, b))
    assert abs(d.remainder) <= slack, (d.remainder, slack)
    w = next(t for t in d.ledger if t.key == "weights")
    assert abs(w.change - 1.0) < 0.011

    pa, pb = tmp_path / "a.log", tmp_path / "b.log"
    pa.write_text(real)
    pb.write_text(_heavier(real, tokens))
    r = cli("diff", pa, pb, "-m", KIMI_CONFIG)
    assert r.code == 0, r.stderr
    assert f"KV tokens 159,277 -> {tokens:,}" in r.stdout and "Why the tokens changed" in r.stdout
    assert f"{load.tokens:+,} tokens" in r.stdout
    j = cli("diff", pa, pb, "-m", KIMI_CONFIG, "-f", "json").json()
    assert j["tokens"]["change"] == tokens - 159277 and j["shares"][0]["key"] == "load"


def test_one_log_with_two_startups_compares_its_last_two(tmp_path):
    real = KIMI_LOG.read_text()
    p = tmp_path / "two.log"
    # a restart: the same startup a day later from other pids (the same lines again are copies, not a restart)
    again = re.sub(r"\[(\d+)\]: ", lambda m: f"[{int(m.group(1)) + 5000}]: ", real).replace("2026-02-25", "2026-02-26")
    p.write_text(real + again)
    r = cli("diff", p, "-m", KIMI_CONFIG, "-f", "json")
    assert r.code == 0, r.stderr
    j = r.json()
    assert j["a"].endswith("startup 1") and j["b"].endswith("startup 2")
    assert j["tokens"]["change"] == 0 and j["shares"] == [] and j["remainder_tokens"] == 0
    single = tmp_path / "one.log"
    single.write_text(real)
    r = cli("diff", single)
    assert r.code == 2 and "one startup" in r.stderr


def test_two_captures_and_a_capture_against_its_log(tmp_path):
    from tests.conftest import FIXTURES

    cap = FIXTURES / "hosts" / "kimi-k25-tp8"
    r = cli("diff", cap, cap, "-f", "json")
    assert r.code == 0, r.stderr
    j = r.json()
    assert j["tokens"] == {"a": 159277, "b": 159277, "change": 0} and j["shares"] == []
    assert any(t["key"] == "weights" for t in j["ledger"])
    log = tmp_path / "heavier.log"
    log.write_text(_heavier(KIMI_LOG.read_text()))
    r = cli("diff", cap, log, "-m", KIMI_CONFIG)
    assert r.code == 0 and "the weights on TP0: +1.00 GiB" in r.stdout, r.stdout


def test_the_shares_add_up_to_the_formulas_change_on_real_pairs():
    """Every pair of real corpus startups of one engine: the steps, however the terms are split (T, load,
    fraction, bytes per token), telescope to the change the formula itself gives, rest x 2^30 / bytes per token
    from A's numbers to B's (within the rounding of the audit's rest to 0.0001 GiB and of each step)."""
    import json
    from itertools import combinations

    from tests.corpus_run import CORPUS, audit_entry

    logs = json.loads((CORPUS / "corpus.json").read_text())["logs"]
    audits = {}
    for name, entry in logs.items():
        a = audit_entry(name, entry)
        if a.formula.logged_tokens is not None and a.formula.bytes_per_token and a.formula.rest_gib is not None:
            audits.setdefault(a.engine, []).append((name, a))
    pairs = 0
    for items in audits.values():
        for (na, a), (nb, b) in combinations(items, 2):
            d = diff(a, b, na, nb)
            if not d.shares:
                continue
            pairs += 1
            assert {s.key for s in d.shares} <= {"pre_load_free_gib", "load", "mem_fraction_static",
                                                 "bytes_per_token", "rest_gib"}
            fa, fb = a.formula, b.formula
            want = fb.rest_gib * GIB / fb.bytes_per_token - fa.rest_gib * GIB / fa.bytes_per_token
            slack = len(d.shares) + 0.0001 * GIB * (1 / fa.bytes_per_token + 1 / fb.bytes_per_token)
            assert abs(sum(s.tokens for s in d.shares) - want) <= slack, (na, nb, d.shares, want)
            assert sum(s.tokens for s in d.shares) + d.remainder == d.tokens_change
    assert pairs >= 30


def test_two_startups_the_history_recorded_are_compared_by_host_and_run(tmp_path):
    """kvaudit diff HOST@RUN HOST@RUN, and HOST alone (its last two startups), from the fleet's own history: a
    restart whose weights took 1 GiB more is named as the load, with the tokens it cost."""
    import json
    import shutil

    from tests.conftest import FIXTURES

    cap = tmp_path / "gpu-07"
    shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", cap)
    inventory, db = tmp_path / "hosts.txt", tmp_path / "history.db"
    inventory.write_text(f"{cap}\n")
    meta = json.loads((cap / "capture.json").read_text())
    real = (cap / "log.txt").read_text()
    probe = _audit(_heavier(KIMI_LOG.read_text()))
    tokens = probe.formula.predicted_tokens.low
    for invocation, text in (("a" * 32, real), ("b" * 32, _heavier(real, tokens))):
        (cap / "log.txt").write_text(text)
        (cap / "capture.json").write_text(json.dumps({**meta, "invocation_id": invocation}))
        r = cli("fleet", inventory, "--history", db)
        assert r.code == 0, r.stderr
    by_run = cli("diff", f"{cap}@1", f"{cap}@2", "--history", db, "-f", "json")
    last_two = cli("diff", str(cap), "--history", db, "-f", "json")
    assert by_run.code == last_two.code == 0, (by_run.stderr, last_two.stderr)
    d = json.loads(by_run.stdout)
    assert json.loads(last_two.stdout)["shares"] == d["shares"]
    assert d["tokens"]["a"] == 159277 and d["tokens"]["b"] == tokens
    load = next(s for s in d["shares"] if s["key"] == "load")
    assert abs(load["tokens"] + GIB / 70272) < 0.01 * GIB / 70272  # 1 GiB of budget at 70,272 B per token
    assert {s["key"] for s in d["shares"]} == {"load"}
    bad = cli("diff", f"{cap}@x", f"{cap}@2", "--history", db)
    assert bad.code == 2 and "HOST@RUN" in bad.stderr


def _diff_at(width: int, *args) -> tuple[int, str, str]:
    """The CLI in-process with $COLUMNS set (a terminal of that width, or a pipe told its width)."""
    import io as _io

    from kvaudit.cli import Environment, run

    out, err = _io.StringIO(), _io.StringIO()
    env = Environment(stdin=_io.BytesIO(), stdout=out, stderr=err, stdout_isatty=False, stderr_isatty=False,
                      environ={"NO_COLOR": "1", "COLUMNS": str(width)})
    code = run(["diff", *map(str, args)], env)
    return code, out.getvalue(), err.getvalue()


def test_line_one_says_what_changed_by_how_much_and_the_setting_that_moved_it():
    """Two real Gemma-4 startups, fp8_e5m2 KV and then bf16 (issue 38, item 2): line 1 names the KV dtype change
    beside the token change; every line fits 80 and 120 columns, the numbers' columns aligned on the right."""
    from tests.conftest import FIXTURES

    corpus, config = FIXTURES / "corpus", FIXTURES / "configs" / "gemma-4-31b-it.json"
    for width in (80, 120):
        code, out, err = _diff_at(width, corpus / "sglang_c004.log", corpus / "sglang_c012.log", "-m", config)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("KV tokens 260,289 -> 117,840 (-142,449"), lines[0]
        assert "kv_cache_dtype fp8_e5m2 -> bf16" in lines[0], lines[0]
        assert all(len(x) <= width for x in lines), [x for x in lines if len(x) > width]
        formula = lines[lines.index("The formula") + 1:lines.index("The formula") + 8]
        ends = {len(x) for x in formula if x.strip()}
        assert len(ends) == 1, formula  # the change column ends in one place
    code, out, _ = _diff_at(200, corpus / "sglang_c004.log", corpus / "sglang_c012.log", "-m", config)
    assert "kv_cache_dtype fp8_e5m2 -> bf16 (bytes per token 40,960 -> 92,211)" in out.splitlines()[0]


def test_a_remainder_beyond_the_logs_rounding_is_not_called_rounding():
    """A startup whose pool misses its formula (sglang_c002 and c004 are both TOKENS_MISMATCH) against another:
    the rest is 'the pool does not follow the formula'; a fraction change between two matching startups
    (c016 -> c017) leaves only rounding, said as such, and line 1 names mem_fraction_static."""
    from tests.conftest import FIXTURES
    from tests.corpus_run import CORPUS, audit_entry
    import json

    logs = json.loads((CORPUS / "corpus.json").read_text())["logs"]
    a, b = (audit_entry(n, logs[n]) for n in ("sglang_c002", "sglang_c004"))
    d = diff(a, b, "c002", "c004")
    assert d.remainder_kind == "off_formula" and abs(d.remainder) > d.rounding_tokens, d
    from kvaudit.diff import render_text

    rest = next(x for x in render_text(d).splitlines() if "the rest:" in x)
    assert "does not follow the formula" in rest and "rounding (" not in rest
    corpus = FIXTURES / "corpus"
    code, out, _ = _diff_at(80, corpus / "sglang_c016.log", corpus / "sglang_c017.log")
    assert code == 0
    assert out.splitlines()[0] == "KV tokens 202,093 -> 214,107 (+12,014, +5.9 %): mem_fraction_static 0.9 -> 0.92"
    assert "the rest: the logs' rounding" in out


def _history(tmp_path, rows):
    """A history file as kvaudit writes it (fleet.history's schema) with these startup rows."""
    from kvaudit.fleet import history

    db = tmp_path / "history.db"
    history.connect(str(db)).close()
    import sqlite3

    con = sqlite3.connect(db)
    base = dict(host="gpu-1", startup_id=None, engine="sglang", version="0.5.9", gpu_name="NVIDIA H200",
                gpu_total_mib=143771.0, tp=8, fraction=0.9, t_gib=137.47, post_gib=24.19, weights_gib=113.2,
                reserve_gib=13.747, free_at_end_gib=4.1, bytes_per_token=70272, bpt_low=None, bpt_high=None,
                tokens=159277, page_size=1, model_key="kimi", rest_gib=10.443)
    for run_id, over in rows:
        con.execute("INSERT INTO runs (id, started_at, started_ts, duration_s, hosts) VALUES (?, '', 0, 1, 1)",
                    (run_id,))
        r = {**base, **over, "run_id": run_id}
        con.execute(f"INSERT INTO startups ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})", tuple(r.values()))
    con.commit()
    con.close()
    return db


def test_a_history_row_claiming_one_byte_per_token_is_refused_as_implausible(tmp_path):
    """Issue 39, item 7: a row saying 1 byte per token turned 10.44 GiB into +11,197,679,384 tokens. Refused,
    one line, exit 2; the same history's real rows still compare."""
    db = _history(tmp_path, [(1, {}), (2, {"bytes_per_token": 1}), (3, {"rest_gib": 11.443, "post_gib": 25.19,
                                                                        "tokens": 174556})])
    r = cli("diff", "gpu-1@1", "gpu-1@2", "--history", db)
    assert r.code == 2 and r.stdout == "", (r.code, r.stdout)
    assert r.stderr.count("\n") == 1 and "implausible" in r.stderr and "1 bytes per token" in r.stderr, r.stderr
    assert "11,197" not in r.stderr
    ok = cli("diff", "gpu-1@1", "gpu-1@3", "--history", db, "-f", "json")
    assert ok.code == 0, ok.stderr
    assert ok.json()["tokens"]["change"] == 174556 - 159277
    for bad in ({"fraction": 7.0}, {"t_gib": 1e308}, {"tokens": 10 ** 9}, {"rest_gib": -5000.0}):
        where = tmp_path / next(iter(bad))
        where.mkdir()
        r = cli("diff", "gpu-1", "--history", _history(where, [(1, {}), (2, bad)]))
        assert r.code == 2 and "refused" in r.stderr, (bad, r.stderr)


def test_a_300_mb_history_row_is_refused_without_loading_it(tmp_path):
    """Issue 39, item 7: a 300 MB row cost 2.6 GB in diff. SQLite's value length is bounded while diff reads: the row is
    refused in one line, under an address-space cap a copy of it into Python would not fit."""
    db = _history(tmp_path, [(1, {}), (2, {"model_key": "x" * (300 << 20)})])
    from tests.conftest import cli_limited

    code, err = cli_limited("diff", "gpu-1@1", "gpu-1@2", "--history", db, address_space=1 << 30)
    assert code == 2, err
    assert "more than 1 MiB" in err and err.count("\n") == 1, err


def _on_a_terminal(columns: int, *args) -> str:
    """kvaudit diff with its stdout a pseudo-terminal of ``columns`` columns (no $COLUMNS): what it printed."""
    from tests.test_width import on_a_terminal

    return "\n".join(on_a_terminal(columns, "diff", *args)) + "\n"


def test_diff_fits_the_terminal_it_runs_on_and_80_columns_piped():
    """Issue 38, items 1 and 2: on a terminal the report takes its width, piped it takes 80 columns; the ledger's
    long labels (the request table's formula, the CUDA-graph item) lose their detail, never wrap."""
    from tests.conftest import FIXTURES

    pair = (FIXTURES / "corpus" / "sglang_c016.log", FIXTURES / "corpus" / "sglang_c017.log")
    for columns in (80, 120):
        out = _on_a_terminal(columns, *pair)
        lines = out.splitlines()
        assert lines[0].startswith("KV tokens 202,093 -> 214,107"), lines[:2]
        assert max(len(x) for x in lines) <= columns, [x for x in lines if len(x) > columns]
    piped = cli("diff", *pair)
    assert max(len(x) for x in piped.stdout.splitlines()) <= 80
    assert "  request table  " in piped.stdout  # its formula dropped to fit


def test_a_bytes_per_token_difference_inside_the_readings_rounding_is_not_a_cause():
    """ux-audit item 12: the Kimi capture (config.json: 70,272 B) and its own journal log (the KV line: 70,244
    +-34 B) are one startup read two ways: line 1 says the tokens did not change and names no cause; the step is
    shown as rounding. c016 -> c017 (two KV-line readings, 40,911 and 40,922) names only the fraction."""
    from tests.conftest import FIXTURES

    code, out, err = _diff_at(120, FIXTURES / "hosts" / "kimi-k25-tp8", KIMI_LOG)
    assert code == 0, err
    assert out.splitlines()[0] == "KV tokens unchanged: 159,277"
    assert "the same cell read two ways" in out and "not a change" in out
    corpus = FIXTURES / "corpus"
    code, out, err = _diff_at(200, corpus / "sglang_c016.log", corpus / "sglang_c017.log")
    assert code == 0, err
    line1 = out.splitlines()[0]
    assert "mem_fraction_static 0.9 -> 0.92" in line1 and "bytes per token" not in line1
    # a real change of the cell stays a cause (c004 -> c012: fp8_e5m2 -> bf16, the readings far apart)
    a = _audit_corpus("sglang_c004", "gemma-4-31b-it.json")
    b = _audit_corpus("sglang_c012", "gemma-4-31b-it.json")
    share = next(s for s in diff(a, b, "A", "B").shares if s.key == "bytes_per_token")
    assert not share.within_rounding and "kv_cache_dtype" in share.cause


def _audit_corpus(name: str, config: str):
    from tests.conftest import FIXTURES

    with open(FIXTURES / "corpus" / f"{name}.log", "rb") as fh:
        return audit(read_log(fh), AuditOptions(model_geometry=load_config(FIXTURES / "configs" / config)))[-1]


def test_two_engines_are_refused_with_the_reason():
    """ux-audit item 13: SGLang's mem_fraction_static (of the free memory before the weights) is not vLLM's
    gpu_memory_utilization (of the total): diff refuses the pair with exit 2 and says why (docs/diff.md)."""
    from tests.conftest import FIXTURES

    corpus = FIXTURES / "corpus"
    code, out, err = _diff_at(80, corpus / "sglang_c002.log", corpus / "vllm_c014.log")
    assert code == 2 and out == ""
    assert "A is SGLang and B is vLLM" in err and "different quantities" in err


def test_a_start_that_failed_is_named_as_failed_not_as_lacking_a_pool_size():
    """Second review, item 9: vllm_c009's second start failed ('10.12 GiB KV cache is needed, which is larger
    than the available KV cache memory'); the diff said only 'B logs no pool size'."""
    r = cli("diff", FIXTURES / "corpus" / "vllm_c009.log")
    first = r.stdout.splitlines()[0]
    assert first.startswith("KV tokens not compared: B's start failed (NOT_ENOUGH_MEMORY: ")
    assert "no pool size" not in first


def test_a_run_whose_start_failed_is_said_as_failed_not_as_unrecorded(tmp_path):
    """Second review, item 10: diff HOST@1 of a run whose start failed said 'no startup ... recorded at or before
    run 1' while history lists that run as error."""
    import json
    import shutil

    cap = tmp_path / "gpu-03"
    shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", cap)
    lines = (FIXTURES / "corpus" / "sglang_c037.log").read_text(encoding="utf-8").splitlines()
    (cap / "log.txt").write_text("".join(f"{i}:{ln}\n" for i, ln in enumerate(lines, 1)))
    meta = json.loads((cap / "capture.json").read_text())
    (cap / "capture.json").write_text(json.dumps({**meta, "config_source": None}))
    inventory, db = tmp_path / "hosts.txt", tmp_path / "history.db"
    inventory.write_text(f"{cap}\n")
    cli("fleet", inventory, "--history", db)
    r = cli("diff", f"{cap}@1", f"{cap}@1", "--history", db)
    assert r.code == 2 and f"{cap}@1 has no pool to compare: its start failed (status error" in r.stderr
