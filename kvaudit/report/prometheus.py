"""A node_exporter textfile (``--textfile-dir``), exposed with ``prometheus_client`` (names, label escaping and
the text format are the library's), written to a temporary file and renamed into place so the collector never
reads half a file.

Each invocation writes its own file (``kvaudit-check-HOST.prom``, ``kvaudit-fleet-INVENTORY.prom``) and labels
its series with ``invocation``, so ``check`` on one host and a nightly ``fleet`` can share one textfile
directory without node_exporter seeing the same series twice. GPU series carry dcgm-exporter's own labels, the
GPU's ``UUID`` and the node's ``Hostname`` (the host's own name, as ``hostname`` printed it there; the target's name
when it printed none), to join with its metrics. Every status is its own 0/1 series, so an alert is a plain
comparison (``kvaudit_host_status{status="failed"} == 1``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from kvaudit import __version__
from kvaudit.reconcile.interface import Finding
from kvaudit.results import HostAudit
from kvaudit.report.rows import findings, gpu_rows, host_summary
from kvaudit.status import ORDER, Status
from kvaudit.units import GIB

GPU_METRICS = (
    ("kvaudit_kv_tokens", "KV cache capacity in tokens (the engine's max_total_num_tokens).", "kv_tokens", 1),
    ("kvaudit_kv_cache_bytes", "KV cache bytes on this GPU, as logged at startup.", "kv_gib", GIB),
    ("kvaudit_weights_bytes", "Model weights on this GPU, as logged at startup.", "weights_gib", GIB),
    ("kvaudit_static_reserve_bytes", "Static reserve (1 - mem_fraction_static) x T.", "reserve_gib", GIB),
    ("kvaudit_unexplained_bytes", "Memory no logged or modelled item accounts for (signed).", "unexplained_gib", GIB),
    ("kvaudit_free_at_startup_end_bytes", "Free GPU memory at the end of startup (log).", "free_at_end_gib", GIB),
    ("kvaudit_gpu_free_bytes", "Free GPU memory now (NVML / nvidia-smi).", "free_now_gib", GIB),
    ("kvaudit_before_t_bytes", "Memory gone before the engine measured T (context, NCCL, other processes).",
     "before_t_gib", GIB),
    ("kvaudit_foreign_process_bytes", "GPU memory held by processes that are not the engine's.", "foreign_gib", GIB),
)


#: the one gauge that may be negative (a ledger over- or under-explained); every other is memory or a count, and a
#: negative value of one is no reading (a log and readings of different starts: READINGS_OF_ANOTHER_START says
#: so): its series is left out rather than exported
SIGNED = frozenset({"kvaudit_unexplained_bytes"})


def _pod_labels(c, gpu) -> tuple[str, str, str]:
    """A pod target's ``namespace``, ``pod`` and ``container`` for one GPU row (the pod its reading came from;
    the group's first pod for a rank without a reading), as dcgm-exporter labels a pod's GPUs; empty for a host."""
    if c is None:
        return "", "", ""
    pod = c.gpu_pods[gpu] if isinstance(gpu, int) and 0 <= gpu < len(c.gpu_pods) else (c.pods[0] if c.pods else "")
    return c.pod_namespace or "", pod, c.pod_container or ""


def filename(kind: str, name: str) -> str:
    """``kvaudit-check-gpu-07.prom``: one file per invocation kind and subject, a safe file name."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:80] or "default"
    return f"kvaudit-{kind}-{safe}.prom"


def render(hosts: Iterable[tuple[str, HostAudit]], run_ts: float, duration_s: float,
           invocation: str = "fleet") -> str:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    hosts = list(hosts)
    reg = CollectorRegistry(auto_describe=True)

    def gauge(name: str, help_: str, labels: tuple[str, ...]) -> Gauge:
        return Gauge(name, help_, ("invocation", *labels), registry=reg)

    build = gauge("kvaudit_build_info", "kvaudit's version (value always 1).", ("version",))
    build.labels(invocation, __version__).set(1)
    rows = [r for name, h in hosts for r in gpu_rows(name, h)]
    node = {name: (h.collected.host if h.collected is not None and h.collected.host else name) for name, h in hosts}
    pods = {name: h.collected for name, h in hosts if h.collected is not None and h.collected.pod_namespace}
    for metric, help_, key, scale in GPU_METRICS:
        g = gauge(metric, help_, ("host", "gpu", "rank", "UUID", "Hostname", "namespace", "pod", "container"))
        for r in rows:
            if r[key] is None or (r[key] < 0 and metric not in SIGNED):
                continue
            value = round(r[key] * scale) if scale != 1 else r[key]
            g.labels(invocation, r["host"], _text(r["gpu"]), _text(r["rank"]), _text(r["uuid"]),
                     _text(node.get(r["host"], r["host"])), *_pod_labels(pods.get(r["host"]), r["gpu"])).set(value)
    summaries = [host_summary(name, h) for name, h in hosts]
    up = gauge("kvaudit_host_up", "1 when the host could be audited, 0 when it failed.", ("host",))
    status = gauge("kvaudit_host_status", "1 for the host's status, 0 for the others (failed, error, warning, "
                   "partial, unchecked, ok: kvaudit's one status, as every report says it).", ("host", "status"))
    failure = gauge("kvaudit_host_failure", "1 when the host failed, with the reason (unreachable, timeout, auth, "
                    "...).", ("host", "reason"))
    match = gauge("kvaudit_tokens_match", "1 when the KV pool size follows the engine's formula, 0 when it does not; "
                  "absent when the pool could not be checked (kvaudit_pool_check says so).", ("host",))
    pool = gauge("kvaudit_pool_check", "1 for the pool check's state, 0 for the others: match, mismatch, "
                 "not_checked (an alert on mismatch never fires on a host that was not checked).", ("host", "state"))
    found = gauge("kvaudit_findings", "Findings by severity.", ("host", "severity"))
    each = gauge("kvaudit_finding", "1 for each finding that counts (not acknowledged), by code: an alert rule "
                 "can name one code.", ("host", "code", "severity"))
    for s in summaries:
        up.labels(invocation, s["host"]).set(0 if s["reason"] else 1)
        current = Status.of(s["status"])
        for st in ORDER:
            status.labels(invocation, s["host"], st.value).set(1 if st is current else 0)
        if s["reason"]:
            failure.labels(invocation, s["host"], s["reason"]).set(1)
        for state in ("match", "mismatch", "not_checked"):
            pool.labels(invocation, s["host"], state).set(1 if s["pool_check"] == state else 0)
        if s["pool_check"] != "not_checked":
            match.labels(invocation, s["host"]).set(1 if s["pool_check"] == "match" else 0)
        for sev, key in (("error", "errors"), ("warning", "warnings"), ("info", "infos")):
            found.labels(invocation, s["host"], sev).set(s[key])
    for name, h in hosts:
        for f in counted_findings(h):
            each.labels(invocation, name, f.code, f.severity.value).set(1)
    gauge("kvaudit_last_run_timestamp_seconds", "When the last audit ran (Unix time).", ()) \
        .labels(invocation).set(run_ts)
    gauge("kvaudit_run_duration_seconds", "How long the last audit took.", ()).labels(invocation).set(duration_s)
    return generate_latest(reg).decode("utf-8")


def counted_findings(h: HostAudit) -> list[Finding]:
    """The host's findings that count (not acknowledged), each code once (the worst severity it has)."""
    best: dict[str, Finding] = {}
    for f in findings(h):
        if not f.ignored and (f.code not in best or f.severity.rank > best[f.code].severity.rank):
            best[f.code] = f
    return list(best.values())


def _text(v: object) -> str:
    return "" if v is None else str(v)


def write(directory: str, text: str, name: str) -> Path:
    from kvaudit.report.files import write_atomic

    d = Path(directory)
    if not d.is_dir():  # node_exporter reads an existing directory: a typo must not create one nobody scrapes
        raise FileNotFoundError(2, "no such directory", directory)
    # node_exporter's textfile collector reads *.prom (world-readable): the temporary name is never one
    return write_atomic(d / name, text, mode=0o644)
