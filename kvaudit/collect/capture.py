"""Captures: everything collected from a host, written to a directory on the auditing machine so on-call can
attach it to a ticket; ``kvaudit check DIR`` audits it exactly as if it were the host.

Layout: ``capture.json`` (metadata and the exact commands run), ``log.txt`` (the filtered log lines as
``N:text``), ``nvidia-smi-gpus.csv`` / ``nvidia-smi-apps.csv`` (nvidia-smi's csv,noheader,nounits format,
whatever the readings came from), ``config.json`` when one was read.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

from kvaudit import __version__
from kvaudit.collect.interface import CollectError, Collected, CommandRecord, ComputeApp, GpuReading, HostProcess
from kvaudit.collect.nvidia_smi import SmiParseError, parse_apps, parse_gpus
from kvaudit.textsafe import printable

FORMAT = "kvaudit-capture"
VERSION = 1


def is_capture(path: str) -> bool:
    p = Path(path) / "capture.json"
    return p.exists() or p.is_symlink()


def _fmt(v: float | None) -> str:
    return "[N/A]" if v is None else (f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}")


def gpus_csv(gpus: tuple[GpuReading, ...]) -> str:
    return "".join(
        f"{g.index}, {g.uuid}, {g.name}, {g.bus_id}, {_fmt(g.total_mib)}, {_fmt(g.reserved_mib)}, "
        f"{_fmt(g.used_mib)}, {_fmt(g.free_mib)}, {g.driver or '[N/A]'}\n" for g in gpus)


def apps_csv(apps: tuple[ComputeApp, ...]) -> str:
    return "".join(f"{a.pid}, {a.gpu_uuid}, {a.name}, {_fmt(a.used_mib)}\n" for a in apps)


FILES = ("capture.json", "log.txt", "nvidia-smi-gpus.csv", "nvidia-smi-apps.csv", "config.json")
#: the most each file of a capture may hold (a capture is untrusted input: it may come from a ticket)
LIMITS = {"capture.json": 4 << 20, "log.txt": 80 << 20, "nvidia-smi-gpus.csv": 1 << 20,
          "nvidia-smi-apps.csv": 4 << 20, "config.json": 4 << 20}


class CaptureError(CollectError):
    reason = "bad_capture"  # the directory is not a well-formed capture: bad input, exit 2


def write(c: Collected, directory: str) -> Path:
    """Write the capture. The directory must be new, empty, or an earlier capture (whose stale files are
    removed); it is never a symlink, and no file is written through one."""
    d = Path(directory)
    if d.is_symlink():
        raise CaptureError(f"{directory}: is a symlink; give the capture a real directory")
    d.mkdir(parents=True, exist_ok=True)
    present = [p.name for p in d.iterdir()]
    if present and not (d / "capture.json").is_file():
        raise CaptureError(f"{directory}: not empty and not a kvaudit capture; refusing to write into it")
    stray = [n for n in present if n not in FILES]
    if stray:
        raise CaptureError(f"{directory}: holds files a capture does not ({', '.join(sorted(stray)[:3])}); "
                           "refusing to write into it")
    meta = {
        "format": FORMAT, "version": VERSION, "kvaudit_version": __version__,
        "target": c.target, "host": c.host, "source": c.source, "unit": c.unit, "invocation_id": c.invocation_id,
        "collected_at": c.collected_at, "config_source": c.config_source, "server_pids": list(c.server_pids),
        "gpu_source": c.gpu_source, "partial": list(c.partial), "bytes_received": c.bytes_received,
        "commands": [asdict(r) for r in c.commands],
    }
    if c.processes or c.meminfo_mib or c.start_pids:  # who held the GPUs: a replay names orphans and tenants too
        meta.update({"processes": [asdict(p) for p in c.processes],
                     "meminfo_mib": [[k, v] for k, v in c.meminfo_mib], "start_pids": list(c.start_pids)})
    if c.pod_namespace:  # a pod target: its Prometheus labels (namespace, the pods, the container) replay too
        meta.update({"pod_namespace": c.pod_namespace, "pod_container": c.pod_container, "pods": list(c.pods),
                     "gpu_pods": list(c.gpu_pods)})
    files = {"capture.json": json.dumps(meta, indent=2) + "\n",
             "log.txt": "".join(f"{n}:{t}\n" for n, t in c.log_lines)}
    if c.gpus:
        files["nvidia-smi-gpus.csv"] = gpus_csv(c.gpus)
        files["nvidia-smi-apps.csv"] = apps_csv(c.apps)
    if c.config_json is not None:
        files["config.json"] = c.config_json
    for name in FILES:  # an earlier capture's file this one does not have would mislead a replay
        if name not in files and name in present:
            (d / name).unlink()
    for name, text in files.items():
        _write_file(d / name, text.encode("utf-8"))
    return d


def _write_file(path: Path, data: bytes) -> None:
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _read_file(d: Path, name: str, directory: str) -> bytes | None:
    """A capture file: absent -> None; a regular file within its size limit -> its bytes; anything else (a
    symlink, a FIFO, a device, a directory, too big) -> CaptureError."""
    path = d / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink; EISDIR is not raised for O_RDONLY, so fstat decides below
        raise CaptureError(f"{directory}: {name}: {exc.strerror or exc} (a capture holds regular files only)") \
            from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CaptureError(f"{directory}: {name} is not a regular file (a capture holds regular files only)")
    with os.fdopen(fd, "rb") as fh:
        limit = LIMITS[name]
        if st.st_size > limit:
            raise CaptureError(f"{directory}: {name} is {st.st_size:,} bytes, over the {limit:,} a capture file "
                               "may hold")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise CaptureError(f"{directory}: {name} is over the {limit:,} bytes a capture file may hold")
    return data


def read(directory: str) -> Collected:
    """A capture directory, read as the untrusted input it is: regular files only, each within its size
    limit; JSON of the expected shape; anything else is a CaptureError (exit 2), never a crash."""
    d = Path(directory)
    raw = _read_file(d, "capture.json", directory)
    if raw is None:
        raise CaptureError(f"{directory}: not a kvaudit capture (no capture.json)")
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CaptureError(f"{directory}: capture.json is not readable JSON ({str(exc)[:120]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CaptureError(f"{directory}: capture.json is not a {FORMAT} file")
    lines = []
    log = _read_file(d, "log.txt", directory)
    if log is not None:
        for row in log.decode("utf-8", errors="replace").split("\n"):
            num, sep, body = row.partition(":")
            if sep and num.isdigit() and len(num) < 12:
                lines.append((int(num), body))
    try:
        gpus_text = _read_file(d, "nvidia-smi-gpus.csv", directory)
        apps_text = _read_file(d, "nvidia-smi-apps.csv", directory)
        gpus = parse_gpus(gpus_text.decode("utf-8", "replace")) if gpus_text is not None else []
        apps = parse_apps(apps_text.decode("utf-8", "replace")) if apps_text is not None else []
    except SmiParseError as exc:
        raise CaptureError(f"{directory}: {exc}") from None
    config = _read_file(d, "config.json", directory)
    try:
        commands = tuple(CommandRecord(**_record(r)) for r in _list(meta, "commands", dict))
        return Collected(
            target=_str(meta, "target") or str(d), host=_str(meta, "host"),
            source=f"capture:{directory} ({_str(meta, 'source') or ''})", log_lines=tuple(lines), gpus=tuple(gpus),
            apps=tuple(apps), config_json=config.decode("utf-8", "replace") if config is not None else None,
            config_source=_str(meta, "config_source"),
            server_pids=tuple(_list(meta, "server_pids", int)), commands=commands,
            partial=tuple(_list(meta, "partial", str)), collected_at=_str(meta, "collected_at") or "",
            unit=_str(meta, "unit"), invocation_id=_str(meta, "invocation_id"), gpu_source=_str(meta, "gpu_source"),
            pod_namespace=_str(meta, "pod_namespace"), pod_container=_str(meta, "pod_container"),
            pods=tuple(_list(meta, "pods", str)), gpu_pods=tuple(_list(meta, "gpu_pods", str)),
            processes=tuple(_process(r) for r in _list(meta, "processes", dict)[:MAX_PROCESSES]),
            meminfo_mib=tuple(_meminfo(r) for r in _list(meta, "meminfo_mib", list)[:64]),
            start_pids=tuple(_list(meta, "start_pids", int)[:MAX_PROCESSES]),
        )
    except (TypeError, ValueError) as exc:
        raise CaptureError(f"{directory}: capture.json has an unexpected shape ({str(exc)[:120]})") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a value a capture holds")


def _str(meta: dict, key: str) -> str | None:
    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise TypeError(f"{key} is a {type(v).__name__}, not text")
    return printable(v)[:1000]


def _list(meta: dict, key: str, kind: type) -> list:
    v = meta.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
        raise TypeError(f"{key} is not a list of {kind.__name__}")
    return [printable(x)[:1000] if isinstance(x, str) else x for x in v]


_RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "command": str, "rc": (int, type(None)), "bytes_received": int, "seconds": (int, float), "truncated": bool}


def _record(r: dict) -> dict:
    if set(r) != set(_RECORD_FIELDS):
        raise TypeError(f"a command record has keys {sorted(r)[:6]}")
    for k, t in _RECORD_FIELDS.items():
        if not isinstance(r[k], t) or (t is int and isinstance(r[k], bool)):
            raise TypeError(f"a command record's {k} is a {type(r[k]).__name__}")
    return {**r, "command": printable(r["command"])[:2000]}


#: a capture names at most this many processes (the host script reads at most 64 processes' memory)
MAX_PROCESSES = 4096
_PROCESS_FIELDS: dict[str, type | tuple[type, ...]] = {
    "pid": int, "ppid": int, "state": str, "title": str, "rss_mib": (int, float, type(None)),
    "swap_mib": (int, float, type(None))}


def _process(r: dict) -> HostProcess:
    if set(r) != set(_PROCESS_FIELDS):
        raise TypeError(f"a process has keys {sorted(r)[:6]}")
    for k, t in _PROCESS_FIELDS.items():
        if not isinstance(r[k], t) or isinstance(r[k], bool):
            raise TypeError(f"a process's {k} is a {type(r[k]).__name__}")
    for k in ("rss_mib", "swap_mib"):
        if r[k] is not None and not 0 <= r[k] < 1 << 40:
            raise ValueError(f"a process's {k} is out of range")
    if not (0 < r["pid"] < 1 << 32 and 0 <= r["ppid"] < 1 << 32):
        raise ValueError("a process id is out of range")
    return HostProcess(pid=r["pid"], ppid=r["ppid"], state=printable(r["state"])[:16],
                       title=printable(r["title"])[:256], rss_mib=r["rss_mib"], swap_mib=r["swap_mib"])


def _meminfo(r: list) -> tuple[str, float]:
    if len(r) != 2 or not isinstance(r[0], str) or isinstance(r[1], bool) or not isinstance(r[1], (int, float)) \
            or not 0 <= r[1] < 1 << 40:
        raise TypeError("a meminfo row is not [name, MiB]")
    return printable(r[0])[:64], float(r[1])
