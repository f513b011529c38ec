"""Reports for ``kvaudit check``: the startup audit, plus the host, its GPUs now, and what was missing."""

from __future__ import annotations

from typing import Any

from kvaudit.results import HostAudit
from kvaudit.report.json import SCHEMA_VERSION, audit_dict, dumps, finding_dict
from kvaudit.report.text import (HEADLINE_LINES, WIDTH, STATUS_COLOURS, colour, fit_columns, headline, not_shown,
                                 render_one, wrap)
from kvaudit.report.view import fmt
from kvaudit.textsafe import md_cell
from kvaudit.verdict import judge_host

#: "rsvd": what the driver keeps of the card (NVML), not SGLang's static reserve
GPU_COLUMNS = ("GPU", "rank", "total", "rsvd", "CUDA total", "before T", "T", "free@end", "used now",
               "free now", "drift", "engine", "others")


def _f(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return fmt(v, signed)


def gpu_rows(h: HostAudit) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for g in h.gpus:
        others = sum(f.gib or 0 for f in g.foreign)
        rows.append((str(g.index), g.rank or "-", _f(g.total_gib), _f(g.reserved_gib), _f(g.cuda_total_gib),
                     _f(g.before_t_gib), _f(g.pre_load_free_gib), _f(g.free_at_end_gib), _f(g.used_gib),
                     _f(g.free_gib), _f(g.drift_gib, True), _f(g.server_gib), _f(others) if g.foreign else "-"))
    return rows


def what_was_checked(h: HostAudit) -> str:
    """The report's heading: the target and the host's own name; a capture replayed is named as the capture of
    its host ("a capture of gpu-node-07, taken 2026-11-29T07:58:33+00:00"), not as the target it was taken
    with ("local" there was the captured machine, not this one)."""
    c = h.collected
    if c is not None and c.source.startswith("capture:"):
        where = c.source[len("capture:"):].split(" (", 1)[0]
        of = c.host or (h.target if h.target != "local" else "an unnamed host")
        return f"{where}: a capture of {of}, taken {c.collected_at}"
    return h.target + (f" ({c.host})" if c and c.host else "")


def host_dict(h: HostAudit) -> dict[str, Any]:
    c = h.collected
    host = {
        "target": h.target,
        "host": c.host if c else None,
        "source": c.source if c else None,
        "unit": c.unit if c else None,
        "invocation_id": c.invocation_id if c else None,
        "collected_at": c.collected_at if c else None,
        "bytes_received": c.bytes_received if c else None,
        "config_source": c.config_source if c else None,
        "gpu_source": c.gpu_source if c else None,
        "server_pids": list(c.server_pids) if c else [],
        "commands": [{"command": r.command, "rc": r.rc, "bytes_received": r.bytes_received, "seconds": r.seconds,
                      "truncated": r.truncated} for r in c.commands] if c else [],
        "partial": list(h.partial),
        "error": {"reason": h.error.reason, "message": str(h.error)} if h.error else None,
        "notes": list(h.notes),
    }
    gpus = [{
        "index": g.index, "uuid": g.uuid, "name": g.name, "bus_id": g.bus_id, "rank": g.rank,
        "mapped_by": g.mapped_by, "total_gib": g.total_gib, "reserved_gib": g.reserved_gib,
        "cuda_total_gib": g.cuda_total_gib, "used_gib": g.used_gib, "free_gib": g.free_gib,
        "pre_load_free_gib": g.pre_load_free_gib, "before_t_gib": g.before_t_gib,
        "free_at_end_gib": g.free_at_end_gib, "drift_gib": g.drift_gib, "engine_gib": g.server_gib,
        "foreign_processes": [{"pid": f.pid, "name": f.name, "gib": f.gib} for f in g.foreign],
        "engine_processes": [{"pid": f.pid, "name": f.name, "gib": f.gib} for f in g.engine_processes],
        "orphaned_processes": [{"pid": f.pid, "name": f.name, "gib": f.gib} for f in g.orphaned],
        "unattributed_gib": g.unattributed_gib, "nvml_identity_holds": g.nvml_identity,
        "ledger": _rank_ledger(h, g.rank),
    } for g in h.gpus]
    if h.audit is not None:
        doc = audit_dict(h.audit)
        doc["findings"] = doc["findings"] + [finding_dict(f) for f in h.findings]
    else:
        doc = {"schema_version": SCHEMA_VERSION, "engine": None, "engine_version": None, "source": None,
               "formula": None, "ranks": [], "findings": [finding_dict(f) for f in h.findings]}
    j = judge_host(h)
    doc["headline"], doc["status"] = j.whole, j.label
    doc["host"] = host
    doc["gpus"] = gpus
    return doc


def _rank_ledger(h: HostAudit, label: str | None) -> Any:
    if h.audit is None or label is None:
        return None
    for r in h.audit.ranks:
        if r.label == label:
            return {"unexplained_gib": r.unexplained_gib,
                    "items": [{"key": i.key, "gib": i.gib} for i in r.items]}
    return None


def render_json(hosts: list[HostAudit]) -> str:
    doc: Any = host_dict(hosts[0]) if len(hosts) == 1 else {"schema_version": SCHEMA_VERSION,
                                                            "hosts": [host_dict(h) for h in hosts]}
    return dumps(doc)


def render_text(hosts: list[HostAudit], color: bool = False, width: int = WIDTH) -> str:
    out = []
    for h in hosts:
        L: list[str] = []
        c = h.collected
        j = judge_host(h)
        head_ = headline(j.whole, width, HEADLINE_LINES)
        L.append(colour(head_[0], STATUS_COLOURS.get(j.status.value, "1"), color))
        L.extend(head_[1:])
        L.extend(colour(x, "1", color) for x in wrap(f"kvaudit check {what_was_checked(h)}", "", width))
        if h.error is not None:
            L.extend(wrap(colour(f"FAILED [{h.error.reason}]: ", "31", color) + str(h.error), "  ", width))
            if c is None:
                out.append("\n".join(L) + "\n")
                continue
            L.append("  no audit; what was read from the host:")
        assert c is not None
        L.extend(wrap(f"source: {c.source or '-'}", "  ", width))
        what = ("HTTP GETs" if c.source.startswith("endpoint") else
                "Kubernetes API requests" if c.source.startswith("k8s") else "commands")
        L.extend(wrap(f"received {c.bytes_received:,} bytes in {len(c.commands)} read-only {what}"
                      f"; GPUs from {c.gpu_source or 'nowhere'}; config from {c.config_source or 'nowhere'}", "  ",
                      width))
        for n in h.notes:
            L.extend(wrap("note: " + n, "  ", width))
        L.append("")
        if h.audit is not None:
            # the audit without its own headline: the host's, above, is the same judgement with the live findings
            L.append(render_one(h.audit, color, width=width, with_headline=False).rstrip("\n"))
            L.append("")
        if h.gpus:
            L.extend(colour(x, "1", color) for x in wrap(
                "GPUs now (GiB; CUDA total = NVML total - driver-reserved; before T = CUDA total - T)", "", width))
            grid = gpu_rows(h)
            table_, kept = fit_columns(GPU_COLUMNS, grid, width, left=2,
                                       drop=("rsvd", "CUDA total", "total", "used now", "drift", "before T", "rank"))
            L.extend(table_)
            L.extend(not_shown(GPU_COLUMNS, grid, kept, "  ", width, row_name="GPU ")[0])
            L.append("")
        if h.findings:
            L.append(colour("Live findings", "1", color))
            for f in h.findings:
                L.append(f"  {f.severity.value:<7} {f.code}" + (" (ignored)" if f.ignored else ""))
                L.extend(wrap(f.message, "    ", width))
            L.append("")
        if h.partial:
            L.append(colour("Partial data", "33", color))
            for p in h.partial:
                L.extend(wrap("- " + p, "  ", width))
            L.append("")
        out.append("\n".join(L))
    return "\n".join(out)


def render_markdown(hosts: list[HostAudit]) -> str:
    from kvaudit.report.markdown import render_one as md_one

    out = []
    for h in hosts:
        L = [f"**{md_cell(judge_host(h).whole)}**", "", f"# kvaudit check {md_cell(what_was_checked(h))}", ""]
        c = h.collected
        if h.error is not None:
            L.append(f"**Failed ({h.error.reason})**: {md_cell(str(h.error))}")
            if c is None:
                out.append("\n".join(L) + "\n")
                continue
            L += ["", "No audit; what was read from the host:", ""]
        assert c is not None
        L += [f"Source: {c.source}; {c.bytes_received:,} bytes received; GPUs from {c.gpu_source or 'nowhere'}.", ""]
        if h.audit is not None:
            L.append(md_one(h.audit).split("\n", 2)[2])  # without its headline: the host's is above
        if h.gpus:
            L += ["### GPUs now (GiB)", "", "| " + " | ".join(GPU_COLUMNS) + " |",
                  "|" + "---|" * 2 + "---:|" * (len(GPU_COLUMNS) - 2)]
            L += ["| " + " | ".join(r) + " |" for r in gpu_rows(h)]
            L.append("")
        if h.findings:
            L += ["### Live findings", "", "| severity | code | message |", "|---|---|---|"]
            L += [f"| {f.severity.value}{' (ignored)' if f.ignored else ''} | `{f.code}` | {f.message} |"
                  for f in h.findings]
            L.append("")
        if h.partial:
            L += ["### Partial data", ""] + [f"- {p}" for p in h.partial] + [""]
        out.append("\n".join(L))
    return "\n".join(out)
