"""What ``kvaudit plan`` reads from the fleet's history and from logs: the command layer's reading, kept out of
kvaudit/plan/ so that the plan package imports no other command package (fleet, explain) and the package graph has
no cycle (the fleet records startups through kvaudit.plan.observe; the plan calibrates on what it recorded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.planning.model import Observed


def history_rows(path: str | None) -> list[Observed] | None:
    """The startups a history (SQLite, ``kvaudit fleet --history``) recorded; None without a history."""
    if not path:
        return None
    from kvaudit.fleet.history import startups

    return startups(path)


def validation_rows(path: str) -> list[Observed]:
    """``plan --validate SOURCE``'s startups: a history's, or those of every log under a directory."""
    p = Path(path)
    if p.is_dir():
        return log_rows(p)
    rows = history_rows(path)
    assert rows is not None
    return rows


def log_rows(directory: Path) -> list[Observed]:
    """Each startup (of an engine kvaudit plans) of each log under ``directory`` (a corpus), audited as explain
    audits it."""
    from kvaudit.explain import audit, read_log
    from kvaudit.parse.lines import InputError
    from kvaudit.plan.observe import from_audit
    from kvaudit.reconcile.interface import AuditOptions

    out: list[Observed] = []
    logs = sorted(x for x in directory.rglob("*.log") if x.is_file())
    if not logs:
        raise KvauditError(f"--validate {directory}: no .log files there")
    for log in logs:
        try:
            with log.open("rb") as fh:
                parsed = read_log(fh)
        except (InputError, OSError):  # NoStartupError is an InputError
            continue
        if parsed.engine.plan is None:
            continue
        for a, s in zip(audit(parsed, AuditOptions(source=str(log)), None, True), parsed.startups):
            if a.formula.pre_load_free_gib is None or a.platform is not None:
                continue  # no T; or T is a unified-memory host's system memory, which the plan does not model
            key = f"{a.model.architecture or 'model'} @ {Path(s.model_path).name}" if s.model_path else None
            row: dict[str, Any] = from_audit(log.name, a, f"startup {a.startup_index}", None, None, key)
            out.append(Observed(run_id=0, **{k: row[k] for k in Observed.__dataclass_fields__ if k != "run_id"}))
    return out
