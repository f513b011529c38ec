"""`kvaudit check http://HOST:PORT`: a live server audited from its own endpoints (SGLang /server_info, vLLM
/metrics, TensorRT-LLM's iteration stats), against real HTTP servers on loopback (issue 12, item 2)."""

from __future__ import annotations

import json
import socket

import pytest

from kvaudit.check import CheckOptions, check
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.status import ExitStatus
from tests.conftest import CONFIGS, FIXTURES, KIMI_CONFIG, cli
from tests.endpointsim import json_doc, metrics_doc, serve, sglang_server_info, vllm_metrics
from tests.hostsim import closed_port

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"
KIMI_ARGS = {"model_path": "/models/moonshotai/Kimi-K2.5", "tp_size": 8, "dp_size": 1, "mem_fraction_static": 0.88,
             "page_size": 1, "kv_cache_dtype": "auto", "dtype": "auto", "speculative_algorithm": "EAGLE3"}


@pytest.fixture(scope="module")
def demo():
    """`make demo`'s audit of the bundled Kimi host: the numbers the endpoint path must reproduce."""
    r = cli("check", KIMI_HOST, "-f", "json")
    assert r.code == ExitStatus.OK, r.stderr
    return r.json()


def _kimi_server_info(demo, **over):
    """/server_info as SGLang 0.5.9 would serve it for the demo's server: its own figures, rounded as it rounds."""
    r0 = demo["ranks"][0]
    mu = {"weight": round(r0["weights_gib"], 2), "kvcache": round(r0["kv_gib"], 2),
          "token_capacity": demo["formula"]["logged_tokens"], "cuda_graph": 1.87}
    mu.update(over)
    return sglang_server_info(KIMI_ARGS, [mu], "0.5.9")


def test_kimi_as_an_sglang_endpoint_gives_the_demo_numbers(demo):
    with serve({"/server_info": json_doc(_kimi_server_info(demo))}) as (url, seen):
        r = cli("check", url, "--model-config", KIMI_CONFIG, "-f", "json")
        h = check(url, CheckOptions(AuditOptions(model_geometry=load_config(KIMI_CONFIG))))
    assert r.code == ExitStatus.PARTIAL_DATA, r.stderr  # no GPU readings from an endpoint: said, not hidden
    d = r.json()
    assert d["from_endpoint"] is True and d["startup"] is None and d["engine"] == "sglang"
    f = d["formula"]
    assert f["verdict"] == "match"
    assert f["logged_tokens"] == demo["formula"]["logged_tokens"] == 159277
    assert f["bytes_per_token"] == demo["formula"]["bytes_per_token"] == 70272
    assert f["mem_fraction_static"] == demo["formula"]["mem_fraction_static"]
    assert d["ranks"][0]["weights_gib"] == round(demo["ranks"][0]["weights_gib"], 2)
    # T is not served by 0.5.9: its estimate lies within the rounding of the demo's measured T
    (est,) = [row.value for row in h.audit.formula_rows if row.quantity.startswith("T estimated")]
    assert abs(est - demo["formula"]["pre_load_free_gib"]) <= 0.03
    assert any("per-rank imbalance cannot be seen" in n for n in d["notes"])
    assert d["host"]["partial"] and "no GPU readings" in d["host"]["partial"][0]
    assert all(s.startswith("GET ") for s in seen) and "GET /server_info" in seen


def test_startup_available_and_dp_groups(demo):
    """0.5.17+: T is served (startup_available), graphs per phase, one state per DP group."""
    mu = {"weight": 72.3, "kvcache": 10.42, "token_capacity": 159277, "startup_available": 94.01,
          "graph": {"decode": 1.87, "prefill": 0.4}}
    doc = sglang_server_info({**KIMI_ARGS, "dp_size": 2, "enable_dp_attention": True}, [mu, mu], "0.5.17")
    with serve({"/server_info": json_doc(doc)}) as (url, _):
        h = check(url, CheckOptions(AuditOptions(model_geometry=load_config(KIMI_CONFIG))))
    a = h.audit
    assert [r.label for r in a.ranks] == ["DP0 TP0", "DP1 TP0"]
    assert a.formula.pre_load_free_gib == 94.01 and a.ranks[0].pre_load_free_gib == 94.01
    assert a.model.attention_tp_size == 4  # DP attention: tp / dp
    (other,) = [row.value for row in a.formula_rows if row.quantity.startswith("mfs x T")]
    assert other == pytest.approx(0.88 * 94.01 - 72.3 - 10.42)
    assert {i.key for i in a.ranks[0].items} >= {"weights", "kv_cache", "graphs_target_decode", "graphs_target_prefill"}


def test_a_pool_the_config_does_not_give_is_a_warning(demo):
    """The server holds twice the tokens the config's bytes per token allow in its pool (an fp8 cache the args
    do not show): LIVE_POOL_MISMATCH names the bytes per token the pool implies."""
    doc = _kimi_server_info(demo, token_capacity=2 * 159277)
    with serve({"/server_info": json_doc(doc)}) as (url, _):
        d = cli("check", url, "--model-config", KIMI_CONFIG, "-f", "json").json()
    assert d["formula"]["verdict"] == "mismatch"
    (f,) = [f for f in d["findings"] if f["code"] == "LIVE_POOL_MISMATCH"]
    assert f["severity"] == "warning" and f["fields"]["implied_bytes_per_token"] == pytest.approx(
        70272 / 2, rel=0.005 / 10.42)  # half the config's, to the rounding of the 10.42 GiB served


def test_without_a_config_the_check_is_said_not_run(demo):
    with serve({"/server_info": json_doc(_kimi_server_info(demo))}) as (url, _):
        r = cli("check", url)
    assert r.code == ExitStatus.PARTIAL_DATA
    assert "not checked" in r.stdout and "--model-config" in r.stdout and "Nothing looks wrong" not in r.stdout


def test_the_old_path_is_read_when_the_new_one_is_not_served(demo):
    with serve({"/get_server_info": json_doc(_kimi_server_info(demo))}) as (url, seen):
        d = cli("check", url, "-m", KIMI_CONFIG, "-f", "json").json()
    assert d["formula"]["verdict"] == "match" and "GET /server_info" in seen and "GET /get_server_info" in seen


LLAMA_LABELS = {"block_size": "16", "cache_dtype": "auto", "gpu_memory_utilization": "0.9",
                "num_gpu_blocks": "27161", "num_cpu_blocks": "None", "enable_prefix_caching": "True"}


def test_vllm_metrics_give_the_pool_and_its_bytes():
    with serve({"/metrics": metrics_doc(vllm_metrics({**LLAMA_LABELS, "kv_cache_size_tokens": "434576"})),
                "/version": json_doc({"version": "0.31.0"})}) as (url, _):
        d = cli("check", url, "-m", CONFIGS / "llama31-8b.json", "-f", "json").json()
    assert d["engine"] == "vllm" and d["engine_version"] == "0.31.0"
    assert d["formula"]["logged_tokens"] == 434576 == 27161 * 16 and d["formula"]["verdict"] == "match"
    # Llama-3.1-8B, TP 1 (assumed, said): 32 layers x 8 heads x (128 + 128) x 2 B = 131072 B per token
    assert d["formula"]["bytes_per_token"] == 131072
    assert d["ranks"][0]["kv_gib"] == pytest.approx(434576 * 131072 / 2**30)
    assert any("TP size (assumed 1" in n for n in d["notes"])


def test_vllm_hybrid_block_size_is_not_trusted():
    with serve({"/metrics": metrics_doc(vllm_metrics(LLAMA_LABELS))}) as (url, _):
        d = cli("check", url, "-m", CONFIGS / "qwen3-next-80b-a3b.json", "-f", "json").json()
    assert d["formula"]["verdict"] == "unknown" and d["formula"]["logged_tokens"] is None
    assert "block_size 16 whatever" in d["formula"]["verdict_reason"]


def test_trtllm_iteration_stats_give_the_pool():
    stats = [{"iter": 1, "kvCacheStats": {"maxNumBlocks": 2710, "freeNumBlocks": 2710, "usedNumBlocks": 0,
                                          "tokensPerBlock": 32}}]
    with serve({"/metrics": json_doc(stats)}) as (url, _):
        d = cli("check", url, "-f", "json").json()
    assert d["engine"] == "trtllm" and d["formula"]["logged_tokens"] == 2710 * 32
    assert d["formula"]["verdict"] == "unknown"  # the budget is not in the stats: said, not guessed


def test_check_with_endpoint_cross_checks_the_live_pool(demo):
    with serve({"/server_info": json_doc(_kimi_server_info(demo))}) as (url, _):
        same = cli("check", KIMI_HOST, "--endpoint", url, "-f", "json")
    with serve({"/server_info": json_doc(_kimi_server_info(demo, token_capacity=150000))}) as (url, _):
        moved = cli("check", KIMI_HOST, "--endpoint", url, "-f", "json")
    assert same.code == ExitStatus.OK and any("= the startup's: 159,277 tokens" in n for n in same.json()["host"]["notes"])
    assert moved.code == ExitStatus.WARNINGS
    codes = [f["code"] for f in moved.json()["findings"]]
    assert "LIVE_POOL_CHANGED" in codes


def test_not_an_inference_server_is_one_line():
    node_exporter = "# TYPE node_load1 gauge\nnode_load1 0.5\n"
    with serve({"/metrics": metrics_doc(node_exporter)}) as (url, _):
        r = cli("check", url)
    assert r.code == ExitStatus.PARTIAL_DATA and "not_inference_server" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    with serve({}) as (url, _):  # 404 everywhere
        r = cli("check", url)
    assert r.code == ExitStatus.PARTIAL_DATA and "serves none of the engines' documents" in r.stderr


def test_redirects_are_not_followed(demo):
    with serve({"/server_info": (302, "", "text/html")}) as (url, seen):
        r = cli("check", url)
    assert r.code == ExitStatus.PARTIAL_DATA and not any("elsewhere" in s for s in seen)


def test_refused_and_silent_servers_are_unreachable_within_the_deadline():
    sock, port = closed_port()
    try:
        r = cli("check", f"http://127.0.0.1:{port}")
    finally:
        sock.close()
    assert r.code == ExitStatus.UNREACHABLE and "unreachable" in r.stderr
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does), never answers
    try:
        r = cli("check", f"http://127.0.0.1:{silent.getsockname()[1]}", "--timeout", "2")
    finally:
        silent.close()
    assert r.code == ExitStatus.UNREACHABLE and "timeout" in r.stderr


@pytest.mark.parametrize("bad", ["http://", "http://host:99999", "https:///x"])
def test_bad_urls_are_usage_errors(bad):
    r = cli("check", bad)
    assert r.code == ExitStatus.BAD_INPUT and "Traceback" not in r.stderr


def test_a_huge_document_is_bounded(demo):
    """A 24 MiB /server_info: read up to the 8 MiB cap, not parsed as SGLang's, one line."""
    big = json.dumps({"x": "y" * (24 << 20)})
    with serve({"/server_info": (200, big, "application/json")}) as (url, _):
        r = cli("check", url)
    assert r.code == ExitStatus.PARTIAL_DATA and "not_inference_server" in r.stderr


def _serving(handle):
    """A loopback TCP server that hands every connection to ``handle(conn, stop)`` in a thread of its own (no
    HTTP library on the server side to tidy what it sends); yields the base URL."""
    import contextlib
    import threading

    @contextlib.contextmanager
    def run():
        srv = socket.create_server(("127.0.0.1", 0))
        stop = threading.Event()

        def serve_one(conn):
            with conn:
                try:
                    handle(conn, stop)
                except OSError:
                    pass  # the client closed

        def loop():
            srv.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except OSError:
                    continue
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            yield f"http://127.0.0.1:{srv.getsockname()[1]}"
        finally:
            stop.set()
            t.join(5)
            srv.close()

    return run()


def _raw_server(answer: bytes):
    """Answers every connection with ``answer`` and closes: what a broken or hostile HTTP server sends."""
    def handle(conn, stop):
        conn.recv(65536)
        conn.sendall(answer)

    return _serving(handle)


@pytest.mark.parametrize("answer,said", [
    (b"SPDY/9 nonsense\r\n\r\n", "not HTTP"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n{}", "longer than HTTP clients accept"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n{}\r\n0\r\n\r\n", "chunked encoding is broken"),
])
def test_a_malformed_http_answer_is_the_servers_failure_not_ours(answer, said):
    """issue 21, item 3: http.client's own exceptions (bad status line, a 100 KB header, a bad chunk) were
    exit 70, 'a bug in kvaudit'; they are the server's failure, unreachable (exit 4), in kvaudit's words."""
    with _raw_server(answer) as url:
        r = cli("check", url, "--timeout", "20")
    assert r.code == ExitStatus.UNREACHABLE and said in r.stderr and "internal error" not in r.stderr, r.stderr


def test_a_4000_digit_number_in_a_document_is_no_reading():
    """issue 21: a /server_info whose token capacity has 4,000 digits parsed (Python's int limit is 4,300) and then
    overflowed a float: exit 70. A number no engine reports makes the document unusable, said, not a crash."""
    big = int("9" * 4000)
    info = sglang_server_info({"model_path": "/m", "tp_size": 1, "dp_size": 1, "mem_fraction_static": 0.88,
                               "page_size": 1}, [{"weight": 72.3, "kvcache": 10.42, "token_capacity": big}], "0.5.9")
    with serve({"/server_info": json_doc(info)}) as (url, _):
        r = cli("check", url, "--timeout", "20")
    assert r.code == ExitStatus.PARTIAL_DATA and "internal error" not in r.stderr, r.stderr


def _endless_server(first: bytes, step: bytes, every: float):
    """Sends ``first`` and then ``step`` every ``every`` seconds until the client goes: a drip of headers or body,
    or ``100 Continue`` without end. Each read the client makes gets a byte well within any socket timeout, so
    only a deadline over the whole request ends it."""
    def handle(conn, stop):
        conn.recv(65536)
        conn.sendall(first)
        while not stop.wait(every):
            conn.sendall(step)

    return _serving(handle)


@pytest.mark.parametrize("first,step", [
    (b"HTTP/1.1 200 OK\r\nX-Drip: ", b"a"),                                               # headers, a byte at a time
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"x\": \"", b"y"),        # the body, likewise
    (b"", b"HTTP/1.1 100 Continue\r\n\r\n"),                                              # 100 Continue, forever
])
def test_a_server_that_never_finishes_its_answer_is_ended_by_the_deadline(first, step):
    """issue 21, item 1: a drip of headers or body, or endless 100 Continue, kept `check --timeout 20` running past
    150 s (each read came within the socket timeout). The host's deadline now bounds the whole request: the check
    ends a few seconds after it, as a timeout (exit 4), in kvaudit's words."""
    import time

    with _endless_server(first, step, 0.2) as url:
        start = time.monotonic()
        r = cli("check", url, "--timeout", "4")
        took = time.monotonic() - start
    assert r.code == ExitStatus.UNREACHABLE and "deadline" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert took < 4 + 25, took  # the deadline plus a margin for a loaded machine's interpreter start


def test_a_metrics_page_with_hundreds_of_thousands_of_labels_is_read_in_bounded_time():
    """issue 21, item 2: /metrics with 200,000-690,000 labels kept the check parsing past 500 s (prometheus_client's
    parser is quadratic in one line's labels; the page was parsed whole). Only the families an engine reads are
    parsed, and a line with more than MAX_LABELS labels is no reading: the real cache_config_info still is."""
    import time

    flood = ",".join(f'l{i}="v"' for i in range(300_000))
    page = (f"vllm:cache_config_info{{{flood}}} 1.0\n" + "".join(f'vllm:noise{{i="{i}"}} 1\n' for i in range(100_000))
            + vllm_metrics({**LLAMA_LABELS, "kv_cache_size_tokens": "434576"}))
    with serve({"/metrics": metrics_doc(page), "/version": json_doc({"version": "0.31.0"})}) as (url, _):
        start = time.monotonic()
        r = cli("check", url, "-m", CONFIGS / "llama31-8b.json", "-f", "json", "--timeout", "30")
        took = time.monotonic() - start
    assert r.code == ExitStatus.PARTIAL_DATA and "internal error" not in r.stderr, r.stderr  # no GPU readings
    assert r.json()["formula"]["logged_tokens"] == 434576
    assert took < 30 + 15, took  # was past 500 s; now the deadline plus a margin bounds it, parsing takes < 1 s


LMDEPLOY_METRICS = (
    "# HELP lmdeploy:backend_config_info information of backend_config\n"
    "# TYPE lmdeploy:backend_config_info gauge\n"
    'lmdeploy:backend_config_info{cache_block_seq_len="64",cache_max_entry_count="0.8",quant_policy="0",'
    'session_len="32768",tp="2"} 1.0\n'
    "# HELP lmdeploy:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE lmdeploy:gpu_cache_usage_perc gauge\n"
    'lmdeploy:gpu_cache_usage_perc{engine="0",model_name="qwen"} 0.125\n'
)


def test_an_lmdeploy_endpoint_reads_its_settings_and_says_the_pool_is_not_exported():
    """lmdeploy serve api_server --enable-metrics (lmdeploy/metrics/loggers.py): the backend config as an info metric
    and the KV usage; no block count, so the pool is unchecked, and the report says why."""
    with serve({"/metrics": metrics_doc(LMDEPLOY_METRICS)}) as (url, seen):
        r = cli("check", url, "-f", "json")
    assert r.code == ExitStatus.PARTIAL_DATA, r.stderr
    d = r.json()
    assert d["engine"] == "lmdeploy" and d["from_endpoint"] is True and d["status"] == "partial"
    f = d["formula"]
    assert f["mem_fraction_static"] == 0.8 and f["verdict"] == "unknown" and f["logged_tokens"] is None
    assert "not the pool's size" in f["verdict_reason"]
    assert any("12.5 %" in n for n in d["notes"])


def test_a_live_budget_off_the_formula_is_a_finding_not_a_note(demo):
    """Issue 33: a server whose weight + kvcache exceed its own mfs x T (startup_available, 0.5.17+) does not
    follow the formula; that is a warning the status counts, never a note beside "Nothing looks wrong"."""
    doc = sglang_server_info(KIMI_ARGS, [{"weight": 72.3, "kvcache": 10.42, "token_capacity": 159277,
                                          "startup_available": 5.0}], "0.5.17")
    with serve({"/server_info": json_doc(doc)}) as (url, _):
        r = cli("check", url, "--model-config", KIMI_CONFIG, "-f", "json")
        text = cli("check", url, "--model-config", KIMI_CONFIG).stdout
    d = r.json()
    (f,) = [f for f in d["findings"] if f["code"] == "BUDGET_MISMATCH"]
    assert f["severity"] == "warning" and f["fields"]["over_gib"] > 70
    assert d["status"] == "warning" and r.code == ExitStatus.WARNINGS
    assert "Nothing looks wrong" not in text and text.startswith("WARNING")
