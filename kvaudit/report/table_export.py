"""One row per GPU as CSV (the standard library's csv module) or Parquet (pyarrow, the ``kvaudit[parquet]`` extra).
Neither needs pandas: 157 MB of install and ~0.5 s of import for a table of a few thousand rows (issue 38, item 7)."""

from __future__ import annotations

from typing import Any, Iterable

from kvaudit.errors import KvauditError
from kvaudit.reconcile.interface import Severity
from kvaudit.report.rows import GPU_FIELDS, findings, gpu_rows, why
from kvaudit.results import HostAudit
from kvaudit.verdict import judge_host
from kvaudit.textsafe import csv_cell

#: the table's columns: the run's start, one GPU's figures, the host's findings that count and why it is not ok
COLUMNS = ("run_at", *GPU_FIELDS, "findings", "why")
#: GiB figures to 2 decimals (10 MiB), the precision every report prints them at; kv_bytes keeps the exact size
GIB_DECIMALS = 2
#: whole numbers (a GPU index, a token or byte count) stay whole in every row, as pandas' nullable Int64 kept them
INTEGER_COLUMNS = ("gpu", "kv_tokens", "kv_bytes")


class ExportError(KvauditError):
    pass


def table_rows(hosts: Iterable[tuple[str, HostAudit]], run_at: str | None = None) -> list[dict[str, Any]]:
    """One row per GPU (a host without GPU rows: one row saying why), each with the run's start time and the
    host's findings that count, so that nightly files can be appended into one table."""
    rows = []
    for name, h in hosts:
        # every host is in the table: one without GPU rows (failed, or nothing read) is one row saying why
        mine = gpu_rows(name, h) or [{**{k: None for k in GPU_FIELDS}, "host": name, "status": judge_host(h).label}]
        reason = why(h)
        # the codes that count, as JSON's summary.findings (docs/json.md): warnings and errors not acknowledged;
        # info findings (TOKENS_MATCH, ...) describe a healthy host and would make every row non-empty
        codes = ";".join(sorted({f.code for f in findings(h) if not f.ignored and f.severity != Severity.INFO}))
        rows += [{"run_at": run_at, **r, "findings": codes, "why": reason} for r in mine]
    for r in rows:
        for k in INTEGER_COLUMNS:
            if isinstance(r.get(k), float) and r[k] == r[k]:
                r[k] = int(r[k])
        for k in COLUMNS:  # every GiB column at one precision (kv_bytes is exact), as the reports print them
            if k.endswith("_gib") and isinstance(r.get(k), float):
                r[k] = round(r[k], GIB_DECIMALS)
    return [{k: r.get(k) for k in COLUMNS} for r in rows]


def _write_csv(tmp: str, rows: list[dict[str, Any]]) -> None:
    import csv

    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(COLUMNS)
        # a spreadsheet opens CSV: text from hosts must not become a formula there; None is an empty cell
        out.writerows([("" if r[k] is None else csv_cell(r[k])) for k in COLUMNS] for r in rows)


def _write_parquet(tmp: str, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def kind(k: str) -> Any:
        if k in INTEGER_COLUMNS:
            return pa.int64()
        values = [r[k] for r in rows if r[k] is not None]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return pa.float64()
        if values and all(isinstance(v, bool) for v in values):
            return pa.bool_()
        return pa.string()

    schema = pa.schema([(k, kind(k)) for k in COLUMNS])
    columns = {k: [r[k] if r[k] is None or schema.field(k).type != pa.string() else str(r[k]) for r in rows]
               for k in COLUMNS}
    pq.write_table(pa.table(columns, schema=schema), tmp)


def write(hosts: Iterable[tuple[str, HostAudit]], path: str, parquet: bool = False, run_at: str | None = None) -> int:
    rows = table_rows(hosts, run_at)
    from kvaudit.report.files import write_atomic_with

    if parquet:
        try:
            import pyarrow  # noqa: F401  (checked first: no temporary file for a format that cannot be written)
        except ImportError:
            raise ExportError("Parquet needs pyarrow: pip install 'kvaudit[parquet]'") from None
    try:
        write_atomic_with(path, lambda tmp: (_write_parquet if parquet else _write_csv)(tmp, rows))
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(rows)
