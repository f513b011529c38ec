"""One fleet run, from the hosts the CLI resolved to the exit status: audit them in parallel, apply the
acknowledgements, then write what was asked (history, the Prometheus textfile, HTML, CSV, the report).

A write that fails is said at the end and never discards the other outputs; an interrupted run writes its
report but no history or textfile (a partial run would read as failed hosts).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import nullcontext
from dataclasses import field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable

from kvaudit.errors import KvauditError
from kvaudit.textsafe import printable
from kvaudit.record import record

if TYPE_CHECKING:
    from kvaudit.check import CheckOptions
    from kvaudit.fleet.inventory import FleetHost
    from kvaudit.report.formats import Format

#: the exit status of a run ended by Ctrl-C (128 + SIGINT, as a shell reports it)
INTERRUPTED = 130


@record
class Outputs:
    """Where the run's results go. ``output`` None is standard output."""

    fmt: Format
    output: str | None = None
    html: str | None = None
    csv: str | None = None
    parquet: bool = False
    textfile_dir: str | None = None
    history: str | None = None
    color: bool = False
    width: int = 120


@record
class FleetJob:
    hosts: tuple[FleetHost, ...]
    opts: CheckOptions
    parallel: int
    run_timeout: float
    outputs: Outputs
    rules: Any = ()  # kvaudit.ignores rules: acknowledged findings
    subject: str = "fleet"  # what the run audits, for the textfile's name and invocation label
    provenance: dict[str, str] = field(default_factory=dict)  # for the HTML report's footer


def run(job: FleetJob, stdout: IO[str], stderr: IO[str], progress: Any = None) -> int:
    """Run the fleet job and return its exit status (kvaudit.verdict.judge_fleet, or 130 when interrupted)."""
    from kvaudit import ignores
    from kvaudit.fleet import runner
    from kvaudit.verdict import judge_fleet

    with progress or nullcontext():
        fleet_run = runner.run(list(job.hosts), job.opts, job.parallel, job.run_timeout,
                               progress.finished if progress else None, progress.started if progress else None)
    fleet_run = replace(fleet_run, results=tuple(
        (f, ignores.apply(h, job.rules, f.name, f.target))  # the inventory's names, never what the host reports
        for f, h in fleet_run.results))
    if fleet_run.interrupted:
        _second_interrupt_exits(stderr)
    failed = _write_outputs(job, fleet_run, stdout)
    for msg in failed:
        stderr.write(f"kvaudit: error: could not write {printable(msg)}\n")
    results = fleet_run.results
    if fleet_run.interrupted:
        done = sum(1 for _, h in results if h.error is None or h.error.reason != "interrupted")
        out = job.outputs
        stderr.write(f"kvaudit: interrupted: {done} of {len(results)} hosts finished"
                     + ("; history and the Prometheus textfile were not written (a partial run would read as "
                        "failed hosts)" if (out.history or out.textfile_dir) else "") + "\n")
        return INTERRUPTED
    return int(judge_fleet([h for _, h in results]).exit_status)


def _write_outputs(job: FleetJob, fleet_run: Any, stdout: IO[str]) -> list[str]:
    """Write every output the job asks for; return what could not be written, one line each."""
    out = job.outputs
    results = [(f.name, h) for f, h in fleet_run.results]
    complete = not fleet_run.interrupted
    failed: list[str] = []

    def attempt(what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except (OSError, KvauditError) as exc:
            failed.append(f"{what}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")
        except Exception as exc:  # an export library's own error (pandas, pyarrow, sqlite)
            failed.append(f"{what}: {type(exc).__name__}: {exc}")

    drift, previous = None, None
    history_path, textfile_dir, csv_path = out.history, out.textfile_dir, out.csv
    if history_path and complete:
        from kvaudit.fleet import history as hist
        from kvaudit.report.rows import gpu_rows, host_summary

        def record() -> None:
            nonlocal drift, previous
            from kvaudit.plan.observe import observed_row

            geometry = job.opts.audit.model_geometry
            observed = [r for n, h in results if (r := observed_row(n, h, geometry)) is not None]
            run_id = hist.record(history_path, fleet_run.started_at, fleet_run.started_ts, fleet_run.duration_s,
                                 [host_summary(n, h) for n, h in results],
                                 [r for n, h in results for r in gpu_rows(n, h)], observed)
            previous, drift = hist.drift(history_path, run_id)

        attempt(f"--history {out.history}", record)
    if textfile_dir and complete:
        from kvaudit.report import prometheus

        attempt(f"--textfile-dir {textfile_dir}", lambda: prometheus.write(
            textfile_dir, prometheus.render(results, fleet_run.started_ts, fleet_run.duration_s,
                                                f"fleet:{job.subject}"),
            prometheus.filename("fleet", job.subject)))
    if out.html:
        page = lambda: (_html(job, fleet_run, drift, results, complete),)  # noqa: E731
        attempt(f"--html {out.html}", lambda: _write_chunks(page(), out.html, stdout))
    if csv_path:
        from kvaudit.report import table_export

        attempt(f"--csv {csv_path}", lambda: table_export.write(results, csv_path, out.parquet, fleet_run.started_at))
    first_run = bool(out.history) and complete and previous is None and not failed
    chunks = out.fmt.fleet_chunks(fleet_run, drift, previous, first_run, color=out.color and out.output is None,
                                  width=out.width)
    attempt(f"-o {out.output}", lambda: _write_chunks(chunks, out.output, stdout))
    return failed


def _html(job: FleetJob, fleet_run: Any, drift: Any, results: list, complete: bool) -> str:
    from kvaudit.report import html as html_report

    trends: dict = {}
    if job.outputs.history and complete:
        from kvaudit.fleet import history as history_db

        try:
            trends = {name: history_db.host_history(job.outputs.history, name, 30) for name, _ in results}
        except history_db.HistoryError:
            trends = {}
    return html_report.render(fleet_run, drift, {**job.provenance, "run": fleet_run.started_at}, trends)


def _write_chunks(chunks: Iterable[str], path: str | None, stdout: IO[str]) -> None:
    """The report piece by piece: to standard output as it is made, or into a file whole or not at all."""
    if path is None:
        for c in chunks:
            stdout.write(c)
        return
    from kvaudit.report.files import write_atomic_with

    def produce(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for c in chunks:
                fh.write(c)

    try:
        write_atomic_with(Path(path), produce)
    except OSError as exc:
        raise KvauditError(f"cannot write {path}: {exc.strerror or exc}") from None


def _second_interrupt_exits(stderr: IO[str]) -> None:
    """After the first Ctrl-C the report for the finished hosts is being written; a second one ends the
    process at once, quietly (no traceback from whatever was running)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):  # noqa: ANN001
        try:
            stderr.write("kvaudit: interrupted again: stopping\n")
            stderr.flush()
            sys.stdout.flush()
        finally:
            os._exit(INTERRUPTED)

    signal.signal(signal.SIGINT, stop)
