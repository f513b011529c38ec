"""A live inference server's HTTP endpoints, simulated on loopback: a real HTTP server (http.server) answering
the documented paths with the shapes the engines serve (updates-2026.md section 4)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


@contextmanager
def listening(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on a free loopback port, in a thread; yields its base URL. The socket is bound and
    listening before the URL is handed out: no readiness wait is needed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serve(documents: dict[str, tuple[int, str, str]]) -> Iterator[tuple[str, list[str]]]:
    """Serve ``path -> (status, body, content type)``; every other path is a 404. Yields the base URL and the
    list of request lines the server saw (to assert what kvaudit asked for). The socket is bound and listening
    before the URL is handed out: no readiness wait is needed."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(f"{self.command} {self.path}")
            status, body, ctype = documents.get(self.path, (404, '{"detail":"Not Found"}', "application/json"))
            data = body.encode()
            self.send_response(status)
            if status in (301, 302, 307, 308):
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802
            seen.append(f"{self.command} {self.path}")
            self.send_response(405)
            self.end_headers()

        def log_message(self, *args):
            pass

    with listening(Handler) as url:
        yield url, seen


def json_doc(doc: object) -> tuple[int, str, str]:
    return 200, json.dumps(doc), "application/json"


def metrics_doc(text: str) -> tuple[int, str, str]:
    return 200, text, "text/plain; version=0.0.4; charset=utf-8"


def sglang_server_info(args: dict, memory_usage: list[dict], version: str) -> dict:
    """``/server_info`` as SGLang serves it: the server arguments at the top level, one internal state per DP
    group (``Scheduler.get_internal_state``), the version."""
    return {**args, "internal_states": [{"memory_usage": m, "last_gen_throughput": 0.0} for m in memory_usage],
            "version": version}


def vllm_metrics(labels: dict[str, str], engine: str = "0") -> str:
    """``/metrics`` with ``vllm:cache_config_info`` (labels are strings) among the usual gauges."""
    lab = ",".join(f'{k}="{v}"' for k, v in {**labels, "engine": engine}.items())
    return ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="{engine}",model_name="m"}} 0.0\n'
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f"vllm:cache_config_info{{{lab}}} 1.0\n")
