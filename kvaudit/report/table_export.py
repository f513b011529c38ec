"""One row per GPU as CSV (or Parquet), through pandas (imported here only: it is slow to import)."""

from __future__ import annotations

from kvaudit.errors import KvauditError
from typing import Iterable

from kvaudit.results import HostAudit
from kvaudit.report.rows import GPU_FIELDS, findings, gpu_rows, why
from kvaudit.verdict import judge_host
from kvaudit.textsafe import csv_cell


class ExportError(KvauditError):
    pass


def write(hosts: Iterable[tuple[str, HostAudit]], path: str, parquet: bool = False, run_at: str | None = None) -> int:
    """One row per GPU (a host without GPU rows: one row saying why), each with the run's start time and the
    host's findings that count, so that nightly files can be appended into one table."""
    import pandas as pd

    rows = []
    for name, h in hosts:
        # every host is in the table: one without GPU rows (failed, or nothing read) is one row saying why
        mine = gpu_rows(name, h) or [{**{k: None for k in GPU_FIELDS}, "host": name, "status": judge_host(h).label}]
        reason = why(h)
        codes = ";".join(sorted({f.code for f in findings(h) if not f.ignored}))
        rows += [{"run_at": run_at, **r, "findings": codes, "why": reason} for r in mine]
    if not parquet:  # a spreadsheet opens CSV: text from hosts must not become a formula there
        rows = [{k: csv_cell(v) for k, v in r.items()} for r in rows]
    df = pd.DataFrame(rows, columns=["run_at", *GPU_FIELDS, "findings", "why"])
    df["gpu"] = df["gpu"].astype("Int64")
    df["kv_tokens"] = df["kv_tokens"].astype("Int64")
    df["kv_bytes"] = df["kv_bytes"].astype("Int64")
    from kvaudit.report.files import write_atomic_with

    try:
        if parquet:
            try:
                import pyarrow  # noqa: F401  (checked first: no temporary file for a format that cannot be written)
            except ImportError:
                raise ExportError("Parquet needs pyarrow: pip install pyarrow") from None
            write_atomic_with(path, lambda tmp: df.to_parquet(tmp, index=False))
        else:
            write_atomic_with(path, lambda tmp: df.to_csv(tmp, index=False))
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(df)
