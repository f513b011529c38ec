"""Live readings against the startup ledger: which GPU each rank ran on, what went before T on it, what
other processes hold there, and how free memory moved since the end of startup. Engine-neutral, pure."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from kvaudit.collect.interface import Collected, ComputeApp, GpuReading, HostProcess
from kvaudit.reconcile.interface import Audit, Finding, RankLedger, Severity, Thresholds
from kvaudit.platforms import detect
from kvaudit.units import MIB, GIB
from kvaudit.record import record

def _patterns(names: tuple[str, ...]) -> tuple["re.Pattern[str]", "re.Pattern[str]"]:
    """Engine processes carry the engine's name in their title (sglang::scheduler_TP3, VLLM::Worker_TP0)."""
    alt = "|".join(re.escape(n) for n in names) or r"(?!)"
    return re.compile(rf"(?:{alt})\S*?(?:TP|_tp|rank)[_=]?(\d+)", re.I), re.compile(alt, re.I)


@record
class ForeignProcess:
    """One process on a GPU and what it holds there: another tenant's (``GpuLedger.foreign``, the name it has had
    since before kvaudit told the engine's own apart), or the engine's, or an orphan's."""

    pid: int
    name: str  # its title where ps read it (sglang::scheduler_TP0, python3 train.py), else nvidia-smi's name
    gib: float | None
    state: str | None = None  # ps's STAT (T: stopped), where read
    swap_gib: float | None = None  # its host memory swapped out (/proc/PID/status VmSwap), where read
    rss_gib: float | None = None  # its resident host memory (VmRSS), where read


#: what makes a process an engine's by its title. A worker carries the engine's name before ``::``
#: (SGLang 0.4-0.5 srt/managers/scheduler.py ``setproctitle(f"sglang::scheduler{prefix}")``, detokenizer,
#: data_parallel_controller; vLLM 0.8+ utils ``set_process_title``: ``VLLM::EngineCore``, ``VLLM::Worker_TP0``,
#: its prefix VLLM_PROCESS_NAME_PREFIX); a launcher runs the engine's program or module among its first words
#: (``python3 -m sglang.launch_server``, ``vllm serve``, ``trtllm-serve``, ``lmdeploy serve``: TensorRT-LLM and
#: LMDeploy set no title of their own, their processes keep the command line)
def _title_kinds(names: tuple[str, ...]) -> tuple["re.Pattern[str]", "re.Pattern[str]"]:
    alt = "|".join(re.escape(n) for n in names) or r"(?!)"
    return (re.compile(rf"^(?:{alt})::", re.I),
            re.compile(rf"(?:^|\s)(?:\S*/)?(?:{alt})(?:[-_.][\w.-]*)?(?:\s|$)", re.I))


#: a stopped or swapped-out tenant: its host memory in swap at least this (GiB) and half of it; a sleeping
#: engine: at most this much GPU memory (GiB) with at least that much host memory resident (vLLM's sleep mode
#: level 1 keeps the weights in pinned host memory; SGLang's release_memory_occupation likewise)
SWAPPED_MIN_GIB = 1.0
ASLEEP_GPU_MAX_GIB = 1.0
ASLEEP_HOST_MIN_GIB = 4.0
#: page cache on a unified-memory host worth naming (GiB), and the share of the host's memory that makes it a
#: warning
PAGE_CACHE_MIN_GIB = 1.0
PAGE_CACHE_WARN_FRACTION = 0.1


@record
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
    engine_processes: tuple[ForeignProcess, ...] = ()  # the engine's processes on this GPU (pid, title, GiB)
    orphaned: tuple[ForeignProcess, ...] = ()  # engine processes of no live start (not in ``foreign``)


@record
class _Roles:
    """Whose each process is: the engine's start (``engine``: known where a cgroup or the start's own PID names
    it), an engine's process of no live start (``orphans``: titled as an engine's worker, outside this start, and
    no launcher of the engine above it), another live engine start's (``other_engines``)."""

    table: dict[int, HostProcess]
    engine: frozenset[int]
    orphans: frozenset[int]
    other_engines: frozenset[int]


def _roles(c: Collected, names: tuple[str, ...]) -> _Roles:
    table = {p.pid: p for p in c.processes}
    worker, launcher = _title_kinds(names)
    titled = {p for p, h in table.items() if worker.search(h.title) or launcher.search(h.title)}
    engine = frozenset(c.server_pids)
    if not engine:
        return _Roles(table, engine, frozenset(), frozenset())
    orphans: set[int] = set()
    others: set[int] = set()
    for pid in titled - engine:
        root, seen = pid, {pid}
        while (parent := table[root].ppid) in titled and parent not in engine and parent not in seen:
            root = parent
            seen.add(root)
        top = table[root].title
        if launcher.search(top) and not worker.search(top):
            others.add(pid)  # another start of the engine, its launcher alive above its workers
        elif _reparented(table[root].ppid, table):
            orphans.add(pid)  # workers whose launcher died: the kernel gave them to init (or a subreaper)
        else:
            others.add(pid)  # workers under a live program that is no launcher of ours (serve.py, Ray): a server
    return _Roles(table, engine, frozenset(orphans), frozenset(others))


#: programs that adopt the processes whose parent died (PID 1 in a container, a subreaper): workers under one of
#: them have lost their launcher; workers under any other live program (a `python serve.py` using the engine's
#: Python API, a Ray worker) are a live server of someone's, never to be killed on kvaudit's word
SUBREAPERS = frozenset({"init", "systemd", "tini", "dumb-init", "docker-init", "s6-svscan", "runsvdir",
                        "containerd-shim", "containerd-shim-runc-v2", "conmon", "catatonit", "supervisord"})


def _reparented(ppid: int, table: dict[int, HostProcess]) -> bool:
    if ppid <= 1:
        return True
    parent = table.get(ppid)
    if parent is None or not parent.title:
        return False
    first = parent.title.split()[0].rsplit("/", 1)[-1]
    return first in SUBREAPERS or ppid == 1


def _agrees(smi_name: str, title: str) -> bool:
    """Whether nvidia-smi's process name and ps's title can be one process's (the same program, or nvidia-smi
    names none): a capture replayed on another machine, or a PID reused since, is then not mixed up."""
    said = smi_name.strip()
    if not said or said in ("[Not Found]", "N/A", "[N/A]") or title.startswith(said):
        return True
    first = lambda t: t.split()[0].rsplit("/", 1)[-1] if t.split() else ""  # noqa: E731
    return first(said) == first(title)


def _process(a: ComputeApp, roles: _Roles) -> ForeignProcess:
    h = roles.table.get(a.pid)
    return ForeignProcess(a.pid, h.title if h and h.title else a.name, _g(a.used_mib), h.state if h else None,
                          _g(h.swap_mib) if h and h.swap_mib is not None else None,
                          _g(h.rss_mib) if h and h.rss_mib is not None else None)


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
    # nvidia-smi may name a process by its executable (python3, or nothing from a container); ps by its whole
    # title (python3 train.py, sglang::scheduler_TP3). A ps row that cannot be nvidia-smi's process is not used.
    by_pid = {a.pid: a.name for a in c.apps}
    c = replace(c, processes=tuple(p for p in c.processes if p.pid not in by_pid or _agrees(by_pid[p.pid], p.title)))
    roles = _roles(c, engine_names)
    apps = tuple(ComputeApp(a.pid, a.gpu_uuid, roles.table[a.pid].title, a.used_mib)
                 if a.pid in roles.table and roles.table[a.pid].title else a for a in c.apps)
    c = replace(c, apps=apps)
    not_this_start = roles.orphans | roles.other_engines
    mapping, how = _map_ranks(audit, c.gpus, tuple(a for a in c.apps if a.pid not in not_this_start), base_gpu_id,
                              rank_in_name)
    pids = set(c.server_pids)
    by_name = any(engine_name.search(a.name) for a in c.apps)
    ledgers: list[GpuLedger] = []
    findings: list[Finding] = []
    for g in sorted(c.gpus, key=lambda x: x.index):
        r = mapping.get(g.uuid)
        here = [a for a in c.apps if a.gpu_uuid == g.uuid]
        server = [a for a in here if _is_server(a, pids, by_name, engine_name) is True]
        orphaned = [a for a in here if a.pid in roles.orphans]
        foreign = [a for a in here if _is_server(a, pids, by_name, engine_name) is False and a not in orphaned]
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
            tuple(_process(a, roles) for a in foreign), unattributed, identity,
            tuple(_process(a, roles) for a in server), tuple(_process(a, roles) for a in orphaned)))

    mapped = [l for l in ledgers if l.rank]
    for l in mapped:
        if l.foreign:
            total = sum(f.gib or 0 for f in l.foreign)
            names = ", ".join(f"pid {f.pid} ({f.name or '?'}{_whose(f.pid, roles)}) "
                              f"{f.gib if f.gib is not None else '?'} GiB" for f in l.foreign)
            findings.append(Finding(
                "FOREIGN_PROCESS", Severity.WARNING,
                f"GPU {l.index} ({l.rank}) is shared: {names}, {total:.2f} GiB in all, outside the engine's ledger",
                {"gpu": l.index, "rank": l.rank, "gib": round(total, 3),
                 "processes": [{"pid": f.pid, "name": f.name, "gib": f.gib} for f in l.foreign]},
                ((l.rank,) if l.rank else ())))
    findings += _node_problems(audit, c, tuple(ledgers), roles)
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
    # T above the GPU's CUDA total: no start on this GPU measured that much free memory, so the log and these
    # readings are of different starts (or hosts). The memory "gone before T" is then no reading (negative), and
    # the free memory now is not comparable with the log's end of startup: no drift is judged on that GPU
    # (ux-audit2 item 17). The log's T is printed to 0.01 GiB, so a start of its own is at most 0.005 GiB below 0
    apart = [l for l in mapped if l.before_t_gib is not None and l.before_t_gib < -0.005]
    if apart:
        w = min(apart, key=lambda l: l.before_t_gib or 0)
        findings.append(Finding(
            "READINGS_OF_ANOTHER_START", Severity.INFO,
            f"GPU {w.index} ({w.rank}): the log's T ({w.pre_load_free_gib:.2f} GiB free before loading) is above "
            f"the GPU's CUDA total now ({w.cuda_total_gib:.2f} GiB), which no start on it can measure: the log and "
            f"these readings are of different starts or hosts; memory before T ({w.before_t_gib:.2f} GiB) is no "
            f"reading (left out of the Prometheus series) and no drift is judged on "
            f"GPU{'s' if len(apart) > 1 else ''} {', '.join(str(l.index) for l in apart)}",
            {"gpu": w.index, "t_gib": w.pre_load_free_gib, "cuda_total_gib": w.cuda_total_gib,
             "before_t_gib": w.before_t_gib, "gpus": [l.index for l in apart]},
            tuple(l.rank for l in apart if l.rank)))
    # memory taken since startup that a named process holds (FOREIGN_PROCESS, ORPHANED_ENGINE_PROCESS and
    # IDLE_TENANT_MEMORY name it, each with its fix) is not counted again as drift: what is left is the engine's
    # own (its allocator's cache under load), and none left is no drift (ux-audit2 item 3)
    # A process that already held its memory when the engine measured T is in "before T", not in the drift:
    # what a GPU had gone before T above the least any of the engine's GPUs had (their CUDA context and NCCL) is
    # taken as held then, and only the named memory above it as taken since
    starts = [l.before_t_gib for l in mapped if l.before_t_gib is not None and l not in apart]
    floor = min(starts) if starts else None
    named = {l.index: round(max(0.0, sum(f.gib or 0 for f in l.foreign + l.orphaned) - (
        max(0.0, l.before_t_gib - floor) if (floor is not None and l.before_t_gib is not None) else 0.0)), 3)
        for l in mapped}
    own = {l.index: _own_drift(l.drift_gib, named[l.index]) for l in mapped
           if l.drift_gib is not None and l not in apart}
    drifted = [l for l in mapped if l.index in own and abs(own[l.index]) > th.drift_gib]
    if drifted:
        w = max(drifted, key=lambda l: abs(own[l.index]))
        d, held = own[w.index], named[w.index] if (w.drift_gib or 0) > 0 else 0.0
        # little is left by the engine's own drift: the named processes' memory is theirs to free
        low = w.free_gib is not None and w.free_gib + min(held, w.drift_gib or 0) < th.low_headroom_gib
        said = (f"{d:+.2f} GiB taken since: activations cached by the allocator under load" if d > 0 else
                f"{-d:.2f} GiB freed since: the allocator gave cached memory back (torch.cuda.empty_cache), or "
                "these readings are of another start than the log's")
        if held > 0:
            said += f"; {held:.2f} GiB more is held by the processes named apart, not counted here"
        findings.append(Finding(
            "MEMORY_DRIFT", Severity.WARNING if low and d > 0 else Severity.INFO,
            f"GPU {w.index} ({w.rank}) has {w.free_gib:.2f} GiB free now against {w.free_at_end_gib:.2f} GiB at the "
            f"end of startup ({said})" + ("; little is left" if low and d > 0 else ""),
            {"gpu": w.index, "drift_gib": w.drift_gib, "engine_drift_gib": d, "named_processes_gib": held,
             "gpus": [l.index for l in drifted]},
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


def _own_drift(drift: float, named: float) -> float:
    """Free memory lost since startup less what named processes hold (at most the loss); a gain is left as is."""
    return round(drift - min(named, drift), 3) if drift > 0 else drift


def _whose(pid: int, roles: _Roles) -> str:
    return ", another engine start's" if pid in roles.other_engines else ""


def _held(pid: int, ledgers: tuple[GpuLedger, ...]) -> list[tuple[int, float | None]]:
    return [(l.index, f.gib) for l in ledgers for f in l.orphaned + l.foreign if f.pid == pid]


def _node_problems(audit: Audit | None, c: Collected, ledgers: tuple[GpuLedger, ...],
                   roles: _Roles) -> list[Finding]:
    """2026's node problems, each with its fix: engine processes no start owns, a stopped, swapped-out or
    sleeping tenant on the engine's GPUs, and the page cache a unified-memory host books as used."""
    out: list[Finding] = []
    # where nvidia-smi lists the GPUs' processes, an orphan that holds none of their memory is no GPU problem (and
    # on a shared machine may be anyone's leftover): only those it lists are named; where it lists none (a PID
    # namespace hides them), the titles are all there is, and every orphan is named (info unless on a GPU)
    orphans = sorted(pid for pid in roles.orphans if not c.apps or _held(pid, ledgers))
    if orphans:
        rows: list[dict[str, Any]] = []
        for pid in orphans:
            h = roles.table[pid]
            held = _held(pid, ledgers)
            gib = round(sum(g or 0 for _, g in held), 3)
            rows.append({"pid": pid, "title": h.title, "state": h.state, "gib": gib,
                         "gpus": [i for i, _ in held], "rss_gib": _g(h.rss_mib)})
        on_gpu = [r for r in rows if r["gpus"]]
        total = round(sum(r["gib"] for r in rows), 3)
        said = ", ".join(f"pid {r['pid']} ({r['title']})" + (f" {r['gib']:.2f} GiB on GPU "
                                                              f"{', '.join(map(str, r['gpus']))}" if r["gpus"] else "")
                         for r in rows[:8]) + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")
        pids = " ".join(str(r["pid"]) for r in rows)
        start = ", ".join(map(str, sorted(c.start_pids or roles.engine)[:4]))
        out.append(Finding(
            "ORPHANED_ENGINE_PROCESS", Severity.WARNING if on_gpu else Severity.INFO,
            f"{len(rows)} engine process{'es' if len(rows) != 1 else ''} outside this start (pid {start}) with no "
            f"launcher of the engine above {'them' if len(rows) != 1 else 'it'}: {said}"
            + (f", {total:.2f} GiB of GPU memory in all" if on_gpu else "")
            + f": left by an earlier start; free {'them' if len(rows) != 1 else 'it'} with `kill {pids}` "
            f"(`kill -9 {pids}` if still there after 30 s)",
            {"gib": total, "pids": [r["pid"] for r in rows], "processes": rows,
             "gpus": sorted({i for r in rows for i in r["gpus"]}), "command": f"kill {pids}"}))
    mapped = {l.index for l in ledgers if l.rank}
    idle: list[dict[str, Any]] = []
    for l in ledgers:
        if l.index not in mapped:
            continue
        for f in l.foreign:
            stopped = (f.state or "")[:1] == "T"
            swapped = f.swap_gib is not None and f.swap_gib >= SWAPPED_MIN_GIB and f.swap_gib >= (f.rss_gib or 0)
            asleep = (f.pid in roles.other_engines and (f.gib or 0) <= ASLEEP_GPU_MAX_GIB
                      and (f.rss_gib or 0) >= ASLEEP_HOST_MIN_GIB)
            if stopped or swapped or asleep:
                how = ("stopped (state T: SIGSTOP, a debugger, a suspended job)" if stopped else
                       f"swapped out ({f.swap_gib:.2f} GiB of its host memory in swap)" if swapped else
                       f"asleep (another engine's start, holding {f.rss_gib:.2f} GiB of host memory as an engine put "
                       "to sleep by vLLM's sleep mode or SGLang's release_memory_occupation does; it takes its GPU "
                       "memory back when woken)")
                idle.append({"pid": f.pid, "title": f.name, "gpu": l.index, "rank": l.rank, "gib": f.gib,
                             "state": f.state, "swap_gib": f.swap_gib, "rss_gib": f.rss_gib,
                             "why": "stopped" if stopped else "swapped" if swapped else "asleep", "how": how})
    for r in idle:
        pid = r["pid"]
        fix = (f"resume it (`kill -CONT {pid}`) so it finishes, or end it (`kill {pid}`)" if r["why"] == "stopped"
               else f"end it (`kill {pid}`) or move it off the engine's GPUs" if r["why"] == "swapped"
               else "give it GPUs of its own, or wake it only while this engine's free memory allows it")
        out.append(Finding(
            "IDLE_TENANT_MEMORY", Severity.WARNING,
            f"pid {r['pid']} ({r['title']}) holds {r['gib'] if r['gib'] is not None else '?'} GiB of GPU {r['gpu']} "
            f"({r['rank']}) while {r['how']}: memory the engine cannot use and no one is using; {fix}",
            {k: v for k, v in r.items() if k != "how"}, (r["rank"],) if r["rank"] else ()))
    unified = (audit is not None and audit.platform is not None and audit.platform_kind != "cpu") or any(
        p.unified_memory for p in (detect([g.name]) for g in c.gpus) if p is not None)
    mem = dict(c.meminfo_mib)
    # Cached counts shared memory too (tmpfs, /dev/shm: NCCL's and the engine's own buffers), which drop_caches
    # cannot free: it is kept apart where the host said it (older captures hold no Shmem line)
    shmem = min(mem.get("Shmem", 0.0), mem.get("Cached", 0.0)) * MIB / GIB
    cached = (mem.get("Cached", 0.0) + mem.get("Buffers", 0.0)) * MIB / GIB - shmem
    if unified and cached >= PAGE_CACHE_MIN_GIB and mem.get("MemTotal"):
        host_gib = mem["MemTotal"] * MIB / GIB
        warn = cached >= PAGE_CACHE_WARN_FRACTION * host_gib
        out.append(Finding(
            "UNIFIED_PAGE_CACHE", Severity.WARNING if warn else Severity.INFO,
            f"{cached:.2f} GiB of this unified-memory host's {host_gib:.2f} GiB is page cache now: CUDA counts it as "
            "used (cudaMemGetInfo's free memory leaves it out), so an engine starting now books it as memory taken "
            "before T (its non-torch memory) and sizes the KV pool that much smaller; drop it before a start with "
            "`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`" + (
                f" ({shmem:.2f} GiB of shared memory, which that cannot free, left out)" if shmem >= 0.01 else ""),
            {"page_cache_gib": round(cached, 3), "mem_total_gib": round(host_gib, 3),
             "shared_memory_gib": round(shmem, 3) if "Shmem" in mem else None,
             "command": "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"}))
    return out
