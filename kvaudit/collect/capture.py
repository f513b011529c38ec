"""Captures: everything collected from a host, written to a directory on the auditing machine so on-call can
attach it to a ticket; ``kvaudit check DIR`` audits it exactly as if it were the host.

Layout: ``capture.json`` (metadata and the exact commands run), ``log.txt`` (the filtered log lines as
``N:text``), ``nvidia-smi-gpus.csv`` / ``nvidia-smi-apps.csv`` (nvidia-smi's csv,noheader,nounits format,
whatever the readings came from), ``config.json`` when one was read.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kvaudit import __version__
from kvaudit.collect.interface import CollectError, Collected, CommandRecord, ComputeApp, GpuReading
from kvaudit.collect.nvidia_smi import SmiParseError, parse_apps, parse_gpus

FORMAT = "kvaudit-capture"
VERSION = 1


def is_capture(path: str) -> bool:
    return (Path(path) / "capture.json").is_file()


def _fmt(v: float | None) -> str:
    return "[N/A]" if v is None else (f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}")


def gpus_csv(gpus: tuple[GpuReading, ...]) -> str:
    return "".join(
        f"{g.index}, {g.uuid}, {g.name}, {g.bus_id}, {_fmt(g.total_mib)}, {_fmt(g.reserved_mib)}, "
        f"{_fmt(g.used_mib)}, {_fmt(g.free_mib)}, {g.driver or '[N/A]'}\n" for g in gpus)


def apps_csv(apps: tuple[ComputeApp, ...]) -> str:
    return "".join(f"{a.pid}, {a.gpu_uuid}, {a.name}, {_fmt(a.used_mib)}\n" for a in apps)


def write(c: Collected, directory: str) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT, "version": VERSION, "kvaudit_version": __version__,
        "target": c.target, "host": c.host, "source": c.source, "unit": c.unit, "invocation_id": c.invocation_id,
        "collected_at": c.collected_at, "config_source": c.config_source, "server_pids": list(c.server_pids),
        "gpu_source": c.gpu_source, "partial": list(c.partial), "bytes_received": c.bytes_received,
        "commands": [asdict(r) for r in c.commands],
    }
    (d / "capture.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (d / "log.txt").write_text("".join(f"{n}:{t}\n" for n, t in c.log_lines), encoding="utf-8")
    if c.gpus:
        (d / "nvidia-smi-gpus.csv").write_text(gpus_csv(c.gpus), encoding="utf-8")
        (d / "nvidia-smi-apps.csv").write_text(apps_csv(c.apps), encoding="utf-8")
    if c.config_json is not None:
        (d / "config.json").write_text(c.config_json, encoding="utf-8")
    return d


def read(directory: str) -> Collected:
    d = Path(directory)
    try:
        meta = json.loads((d / "capture.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CollectError(f"{directory}: not a readable kvaudit capture ({exc})") from None
    if meta.get("format") != FORMAT:
        raise CollectError(f"{directory}: capture.json is not a {FORMAT} file")
    lines = []
    log = d / "log.txt"
    if log.exists():
        for raw in log.read_text(encoding="utf-8", errors="replace").split("\n"):
            num, sep, body = raw.partition(":")
            if sep and num.isdigit():
                lines.append((int(num), body))
    try:
        gpus = parse_gpus((d / "nvidia-smi-gpus.csv").read_text()) if (d / "nvidia-smi-gpus.csv").exists() else []
        apps = parse_apps((d / "nvidia-smi-apps.csv").read_text()) if (d / "nvidia-smi-apps.csv").exists() else []
    except SmiParseError as exc:
        raise CollectError(f"{directory}: {exc}") from None
    config = (d / "config.json").read_text(encoding="utf-8") if (d / "config.json").exists() else None
    return Collected(
        target=meta.get("target") or str(d), host=meta.get("host"),
        source=f"capture:{directory} ({meta.get('source', '')})", log_lines=tuple(lines), gpus=tuple(gpus),
        apps=tuple(apps), config_json=config, config_source=meta.get("config_source"),
        server_pids=tuple(meta.get("server_pids") or ()),
        commands=tuple(CommandRecord(**r) for r in meta.get("commands", [])),
        partial=tuple(meta.get("partial") or ()), collected_at=meta.get("collected_at", ""),
        unit=meta.get("unit"), invocation_id=meta.get("invocation_id"), gpu_source=meta.get("gpu_source"),
    )
