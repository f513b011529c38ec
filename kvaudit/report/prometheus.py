"""A node_exporter textfile (``--textfile-dir``): written to a temporary file and renamed into place, so
the collector never reads half a file. Metric names start with ``kvaudit_``; labels host, gpu, rank."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from kvaudit.check import HostAudit
from kvaudit.report.rows import gpu_rows, host_summary
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
FILENAME = "kvaudit.prom"


def _esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv: Any) -> str:
    items = [(k, v) for k, v in kv.items() if v is not None]
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in items) + "}" if items else ""


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def render(hosts: Iterable[tuple[str, HostAudit]], run_ts: float, duration_s: float) -> str:
    hosts = list(hosts)
    out: list[str] = []

    def family(name: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            out.append(f"{name}{labels} {_num(value)}")

    rows = [r for name, h in hosts for r in gpu_rows(name, h)]
    for metric, help_, key, scale in GPU_METRICS:
        samples = [(_labels(host=r["host"], gpu=r["gpu"], rank=r["rank"]),
                    round(r[key] * scale) if scale != 1 else r[key]) for r in rows if r[key] is not None]
        family(metric, help_, samples)
    summaries = [host_summary(name, h) for name, h in hosts]
    family("kvaudit_host_up", "1 when the host could be audited, 0 when it failed.",
           [(_labels(host=s["host"]), 0 if s["reason"] else 1) for s in summaries])
    family("kvaudit_host_status", "The host's status as a label (value always 1).",
           [(_labels(host=s["host"], status=s["status"]), 1) for s in summaries])
    family("kvaudit_tokens_match", "1 when the KV pool size matches the engine's formula.",
           [(_labels(host=s["host"]), 1 if s["verdict"] == "match" else 0) for s in summaries if s["verdict"]])
    family("kvaudit_findings", "Findings by severity.",
           [(_labels(host=s["host"], severity=sev), s[key]) for s in summaries
            for sev, key in (("error", "errors"), ("warning", "warnings"), ("info", "infos"))])
    family("kvaudit_last_run_timestamp_seconds", "When the last audit ran (Unix time).", [("", run_ts)])
    family("kvaudit_run_duration_seconds", "How long the last audit took.", [("", duration_s)])
    return "\n".join(out) + "\n"


def write(directory: str, text: str, filename: str = FILENAME) -> Path:
    d = Path(directory)
    if not d.is_dir():  # node_exporter reads an existing directory: a typo must not create one nobody scrapes
        raise FileNotFoundError(2, "no such directory", directory)
    fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, d / filename)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return d / filename
