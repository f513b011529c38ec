"""One audited host as a startup the plan can calibrate on (the history's ``startups`` table)."""

from __future__ import annotations

from typing import Any


def observed_row(name: str, h: Any, geometry: Any = None) -> dict[str, Any] | None:
    """The terms of an audited startup that a plan calibrates on, or None when the audit has no T (an endpoint,
    a failed host, a log without the free-memory lines). ``geometry``: the model config the fleet was given
    (--model-config); else the host's own config.json, when it was read."""
    from kvaudit.planning.model import model_key

    a = h.audit
    if a is None or a.from_endpoint or a.formula.pre_load_free_gib is None or a.platform is not None:
        return None  # no T to calibrate on; or T is a unified-memory host's system memory (not modelled by plan)
    if geometry is None and h.collected is not None and h.collected.config_json:
        from kvaudit.model_config import geometry_from_text

        try:
            geometry = geometry_from_text(h.collected.config_json, h.collected.config_source or "config.json")
        except Exception:  # noqa: BLE001 - a config the audit could not use is no model key either
            geometry = None
    mapped = [g for g in h.gpus if g.rank is not None] or list(h.gpus)
    totals = [g.total_gib * 1024 for g in mapped if g.total_gib is not None]
    names = sorted({g.name for g in mapped if g.name})
    return from_audit(name, a, startup_of(h), names[0] if len(names) == 1 else None,
                      round(min(totals), 1) if totals else None, model_key(geometry) if geometry is not None else None)


def startup_of(h: Any) -> str | None:
    """Which start of the server was audited (the fleet's ``startup_id``, computed here from the host's collected
    source so that plan/ imports no report module): the unit's invocation id, else the log source and the startup's
    first line. None for an endpoint, which has no startup to tell apart."""
    c, a = h.collected, h.audit
    if c is None or a is None or a.from_endpoint:
        return None
    if c.invocation_id:
        return f"invocation {c.invocation_id}"
    return f"{c.source} startup at line {a.first_line}"


def from_audit(name: str, a: Any, startup_id: str | None, gpu_name: str | None, gpu_total_mib: float | None,
               key: str | None) -> dict[str, Any]:
    """The row of one audited startup (a fleet's host, or a log replayed by --validate)."""
    f = a.formula
    weights = [r.weights_gib for r in a.ranks if r.weights_gib is not None]
    ends = [r.free_at_end_gib for r in a.ranks if r.free_at_end_gib is not None and r.end_is_final]
    return {
        "host": name, "startup_id": startup_id, "engine": a.engine,
        "version": a.engine_version or None,  # one release, or the range the log allows ("0.5.10..0.5.12")
        "gpu_name": gpu_name, "gpu_total_mib": gpu_total_mib,
        "tp": len(a.ranks) or None, "fraction": f.mem_fraction_static,
        "t_gib": f.pre_load_free_gib, "post_gib": f.post_load_free_gib,
        "weights_gib": max(weights) if weights else None, "reserve_gib": f.reserve_gib,
        "free_at_end_gib": min(ends) if ends and len(ends) == len(a.ranks) else None,
        "bytes_per_token": f.bytes_per_token, "tokens": f.logged_tokens, "page_size": f.page_size,
        "bpt_low": f.bytes_per_token_range[0] if f.bytes_per_token_range else None,
        "bpt_high": f.bytes_per_token_range[1] if f.bytes_per_token_range else None,
        "model_key": key, "rest_gib": f.rest_gib, "rocm": a.rocm,
    }
