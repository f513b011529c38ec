"""Live readings against the startup ledger: which GPU each rank ran on, what went before T on it, what
other processes hold there, and how free memory moved since the end of startup. Engine-neutral, pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvaudit.collect.interface import Collected, ComputeApp, GpuReading
from kvaudit.reconcile.interface import Audit, Finding, RankLedger, Severity, Thresholds
from kvaudit.units import MIB, GIB

def _patterns(names: tuple[str, ...]) -> tuple["re.Pattern[str]", "re.Pattern[str]"]:
    """Engine processes carry the engine's name in their title (sglang::scheduler_TP3, VLLM::Worker_TP0)."""
    alt = "|".join(re.escape(n) for n in names) or r"(?!)"
    return re.compile(rf"(?:{alt})\S*?(?:TP|_tp|rank)[_=]?(\d+)", re.I), re.compile(alt, re.I)


@dataclass(frozen=True)
class ForeignProcess:
    pid: int
    name: str
    gib: float | None


@dataclass(frozen=True)
class GpuLedger:
    index: int
    uuid: str
    name: str
    bus_id: str
    rank: str | None  # the engine rank on this GPU, None when none
    mapped_by: str | None  # "process name" | "index order"
    total_gib: float | None
    reserved_gib: float | None
    cuda_total_gib: float | None  # NVML total - reserved: what torch.cuda.mem_get_info calls total
    used_gib: float | None
    free_gib: float | None
    pre_load_free_gib: float | None  # T on this rank (startup)
    before_t_gib: float | None  # cuda_total - T: CUDA context, NCCL, other processes at startup
    free_at_end_gib: float | None  # at the end of startup (log)
    drift_gib: float | None  # free_at_end - free now: memory taken since startup
    server_gib: float | None  # the engine's processes on this GPU now
    foreign: tuple[ForeignProcess, ...]
    unattributed_gib: float | None  # used - all processes' usage
    nvml_identity: bool | None  # total = reserved + used + free (within 2 MiB)


def _g(mib: float | None) -> float | None:
    return None if mib is None else round(mib * MIB / GIB, 3)


def _is_server(app: ComputeApp, server_pids: set[int], names_identify: bool,
               engine_name: "re.Pattern[str]") -> bool | None:
    """By the unit's PIDs when known; else by process title (sglang::scheduler_TPn) when the engine's
    processes carry one on this host; else unknown."""
    if server_pids:
        return app.pid in server_pids
    if engine_name.search(app.name):
        return True
    return False if names_identify else None


def _map_ranks(audit: Audit | None, gpus: tuple[GpuReading, ...], apps: tuple[ComputeApp, ...],
               base_gpu_id: int, rank_in_name: "re.Pattern[str]") -> tuple[dict[str, RankLedger], dict[str, str]]:
    """uuid -> rank ledger, and how each was mapped. Process titles (sglang::scheduler_TP3) first; else
    rank i -> the (base_gpu_id + i)-th GPU in index order (CUDA_VISIBLE_DEVICES unknown)."""
    if audit is None or not audit.ranks:
        return {}, {}
    by_label = {r.label: r for r in audit.ranks}
    out: dict[str, RankLedger] = {}
    how: dict[str, str] = {}
    for a in apps:
        m = rank_in_name.search(a.name)
        if m:
            label = f"TP{m.group(1)}"
            if label in by_label and a.gpu_uuid not in out:
                out[a.gpu_uuid], how[a.gpu_uuid] = by_label[label], "process name"
    if out:
        return out, how
    ordered = sorted(gpus, key=lambda g: g.index)[base_gpu_id:]
    for r, g in zip(audit.ranks, ordered):
        out[g.uuid], how[g.uuid] = r, "index order"
    return out, how


def reconcile_gpus(audit: Audit | None, c: Collected, base_gpu_id: int = 0,
                   th: Thresholds = Thresholds(),
                   engine_names: tuple[str, ...] = ()) -> tuple[tuple[GpuLedger, ...], tuple[Finding, ...]]:
    rank_in_name, engine_name = _patterns(engine_names)
    mapping, how = _map_ranks(audit, c.gpus, c.apps, base_gpu_id, rank_in_name)
    pids = set(c.server_pids)
    by_name = any(engine_name.search(a.name) for a in c.apps)
    ledgers: list[GpuLedger] = []
    findings: list[Finding] = []
    for g in sorted(c.gpus, key=lambda x: x.index):
        r = mapping.get(g.uuid)
        here = [a for a in c.apps if a.gpu_uuid == g.uuid]
        server = [a for a in here if _is_server(a, pids, by_name, engine_name) is True]
        foreign = [a for a in here if _is_server(a, pids, by_name, engine_name) is False]
        cuda_total = (g.total_mib - (g.reserved_mib or 0)) if g.total_mib is not None else None
        identity = None
        if None not in (g.total_mib, g.reserved_mib, g.used_mib, g.free_mib):
            identity = abs(g.total_mib - g.reserved_mib - g.used_mib - g.free_mib) <= 2  # type: ignore[operator]
        used_apps = sum(a.used_mib or 0 for a in here)
        unattributed = _g(g.used_mib - used_apps) if (g.used_mib is not None and here) else None
        t = r.pre_load_free_gib if r else None
        before_t = round(_g(cuda_total) - t, 3) if (cuda_total is not None and t is not None) else None  # type: ignore
        end = r.free_at_end_gib if r else None
        free_now = _g(g.free_mib)
        drift = round(end - free_now, 3) if (end is not None and free_now is not None) else None
        ledgers.append(GpuLedger(
            g.index, g.uuid, g.name, g.bus_id, r.label if r else None, how.get(g.uuid),
            _g(g.total_mib), _g(g.reserved_mib), _g(cuda_total), _g(g.used_mib), free_now, t, before_t, end, drift,
            round(sum(a.used_mib or 0 for a in server) * MIB / GIB, 3) if server else None,
            tuple(ForeignProcess(a.pid, a.name, _g(a.used_mib)) for a in foreign), unattributed, identity))

    mapped = [l for l in ledgers if l.rank]
    for l in mapped:
        if l.foreign:
            total = sum(f.gib or 0 for f in l.foreign)
            names = ", ".join(f"pid {f.pid} ({f.name or '?'}) {f.gib if f.gib is not None else '?'} GiB"
                              for f in l.foreign)
            findings.append(Finding(
                "FOREIGN_PROCESS", Severity.WARNING,
                f"GPU {l.index} ({l.rank}) is shared: {names}, {total:.2f} GiB in all, outside the engine's ledger",
                {"gpu": l.index, "rank": l.rank, "gib": round(total, 3),
                 "processes": [{"pid": f.pid, "name": f.name, "gib": f.gib} for f in l.foreign]},
                ((l.rank,) if l.rank else ())))
    occupied = [l for l in mapped if l.before_t_gib is not None and l.before_t_gib > th.occupied_at_startup_gib]
    if occupied:
        w = max(occupied, key=lambda l: l.before_t_gib or 0)
        findings.append(Finding(
            "OCCUPIED_AT_STARTUP", Severity.WARNING,
            f"{w.before_t_gib:.2f} GiB of GPU {w.index} ({w.rank}) was already gone when the engine measured T "
            f"(CUDA context and NCCL take about 1-2 GiB): another process held memory at startup, and the KV "
            f"pool is smaller for it",
            {"gpu": w.index, "before_t_gib": w.before_t_gib, "gpus": [l.index for l in occupied]},
            tuple(l.rank for l in occupied if l.rank)))
    if audit is not None and audit.ranks:
        n_ranks, n_mapped = len(audit.ranks), len(mapped)
        if c.gpus and n_mapped < n_ranks:
            findings.append(Finding(
                "GPU_COUNT_MISMATCH", Severity.WARNING,
                f"the log has {n_ranks} ranks but only {n_mapped} of the host's {len(c.gpus)} GPUs could be matched "
                "to them (different host, CUDA_VISIBLE_DEVICES, or a restart since)",
                {"ranks": n_ranks, "gpus": len(c.gpus), "mapped": n_mapped}))
        idle = [l for l in ledgers if not l.rank]
        if idle and mapped:
            findings.append(Finding(
                "IDLE_GPUS", Severity.INFO,
                f"GPU(s) {', '.join(str(l.index) for l in idle)} run no rank of this engine",
                {"gpus": [l.index for l in idle]}))
    drifted = [l for l in mapped if l.drift_gib is not None and abs(l.drift_gib) > th.drift_gib]
    if drifted:
        w = max(drifted, key=lambda l: abs(l.drift_gib or 0))
        low = w.free_gib is not None and w.free_gib < th.low_headroom_gib
        findings.append(Finding(
            "MEMORY_DRIFT", Severity.WARNING if low else Severity.INFO,
            f"GPU {w.index} ({w.rank}) has {w.free_gib:.2f} GiB free now against {w.free_at_end_gib:.2f} GiB at the "
            f"end of startup ({w.drift_gib:+.2f} GiB taken since: activations cached by the allocator under load"
            + (", or another process" if w.foreign else "") + ")" + ("; little is left" if low else ""),
            {"gpu": w.index, "drift_gib": w.drift_gib, "gpus": [l.index for l in drifted]},
            tuple(l.rank for l in drifted if l.rank)))
    unattr = [l for l in ledgers if l.unattributed_gib is not None and l.unattributed_gib > th.unattributed_gib]
    if unattr:
        w = max(unattr, key=lambda l: l.unattributed_gib or 0)
        findings.append(Finding(
            "UNATTRIBUTED_GPU_MEMORY", Severity.INFO,
            f"{w.unattributed_gib:.2f} GiB used on GPU {w.index} belongs to no listed process (a container without "
            "the host PID namespace, or a driver-side allocation)",
            {"gpu": w.index, "gib": w.unattributed_gib, "gpus": [l.index for l in unattr]}))
    return tuple(ledgers), tuple(findings)
