"""Running one corpus entry through the audit, as `kvaudit explain` would (shared by the corpus test and
scripts/corpus.py)."""

from __future__ import annotations

from pathlib import Path

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import Audit, AuditOptions

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fixtures" / "corpus"


def options(entry: dict) -> AuditOptions:
    geom = load_config(ROOT / "fixtures" / "configs" / entry["config"]) if entry.get("config") else None
    return AuditOptions(source=entry.get("name", "-"), model_geometry=geom,
                        mem_fraction_static=entry.get("mem_fraction_static"), tp_size=entry.get("tp_size"))


def audit_entry(name: str, entry: dict) -> Audit:
    """The latest startup of the log (the one `explain` reports by default)."""
    with open(CORPUS / f"{name}.log", "rb") as fh:
        return audit(read_log(fh), options(entry))[-1]
