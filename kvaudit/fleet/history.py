"""Run history in SQLite: every run's host summaries and GPU rows, and the drift between two runs
("gpu-17: KV tokens fell from 159,277 to 133,500")."""

from __future__ import annotations

from kvaudit.errors import KvauditError
from kvaudit.results import Drift
import json
from pathlib import Path
import sqlite3
from typing import Any, Sequence

#: ``gpus_by_run``: drift reads one run's GPU rows (``WHERE run_id = ?``); without the index every run scanned the
#: whole table, so a fleet run grew slower with its history (issue 23: +13 % at 1,000 runs)
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL,
    started_ts REAL NOT NULL, duration_s REAL NOT NULL, hosts INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS hosts (run_id INTEGER NOT NULL REFERENCES runs(id), host TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT, tokens INTEGER, verdict TEXT, weights_gib REAL, free_min_gib REAL,
    unexplained_gib REAL, findings TEXT NOT NULL, PRIMARY KEY (run_id, host));
CREATE TABLE IF NOT EXISTS gpus (run_id INTEGER NOT NULL REFERENCES runs(id), host TEXT NOT NULL,
    gpu INTEGER, rank TEXT, tokens INTEGER, kv_gib REAL, weights_gib REAL, free_now_gib REAL,
    free_at_end_gib REAL, unexplained_gib REAL);
CREATE TABLE IF NOT EXISTS startups (run_id INTEGER NOT NULL REFERENCES runs(id), host TEXT NOT NULL,
    startup_id TEXT, engine TEXT NOT NULL, version TEXT, gpu_name TEXT, gpu_total_mib REAL, tp INTEGER,
    fraction REAL, t_gib REAL, post_gib REAL, weights_gib REAL, reserve_gib REAL, free_at_end_gib REAL,
    bytes_per_token INTEGER, bpt_low REAL, bpt_high REAL, tokens INTEGER, page_size INTEGER, model_key TEXT,
    rest_gib REAL, PRIMARY KEY (run_id, host));
CREATE INDEX IF NOT EXISTS hosts_by_name ON hosts(host, run_id);
CREATE INDEX IF NOT EXISTS gpus_by_run ON gpus(run_id);
"""
#: columns added after the first release, with their type: an older history file gains them on open
ADDED_COLUMNS = {"hosts": (("startup_id", "TEXT"), ("counted", "TEXT")),
                 "startups": (("bpt_low", "REAL"), ("bpt_high", "REAL"), ("page_size", "INTEGER"),
                              ("rest_gib", "REAL"))}

FREE_DRIFT_GIB = 0.5
WEIGHTS_DRIFT_GIB = 0.05


class HistoryError(KvauditError):
    pass


def connect(path: str) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(path)
        db.executescript(SCHEMA)
        for table, columns in ADDED_COLUMNS.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns:
                if name not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        db.commit()
        return db
    except sqlite3.Error as exc:
        raise HistoryError(f"history database {path}: {exc}") from None


STARTUP_COLUMNS = ("host", "startup_id", "engine", "version", "gpu_name", "gpu_total_mib", "tp", "fraction", "t_gib",
                   "post_gib", "weights_gib", "reserve_gib", "free_at_end_gib", "bytes_per_token", "bpt_low",
                   "bpt_high", "tokens", "page_size", "model_key", "rest_gib")


def record(path: str, started_at: str, started_ts: float, duration_s: float, summaries: list[dict],
           gpu_rows: list[dict], startup_rows: Sequence[dict] = ()) -> int:
    db = connect(path)
    try:
        with db:
            cur = db.execute("INSERT INTO runs (started_at, started_ts, duration_s, hosts) VALUES (?, ?, ?, ?)",
                             (started_at, started_ts, duration_s, len(summaries)))
            run_id = int(cur.lastrowid or 0)
            db.executemany(
                "INSERT INTO hosts (run_id, host, status, reason, tokens, verdict, weights_gib, free_min_gib, "
                "unexplained_gib, findings, startup_id, counted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, s["host"], s["status"], s["reason"], s["tokens"], s["verdict"], s["weights_gib"],
                  s["free_min_gib"], s["unexplained_gib"], json.dumps(s["all_findings"]), s.get("startup_id"),
                  json.dumps(s["findings"]) if s.get("findings") is not None else None)
                 for s in summaries])
            db.executemany(
                "INSERT INTO gpus VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, r["host"], r["gpu"], r["rank"], r["kv_tokens"], r["kv_gib"], r["weights_gib"],
                  r["free_now_gib"], r["free_at_end_gib"], r["unexplained_gib"]) for r in gpu_rows])
            db.executemany(
                f"INSERT INTO startups (run_id, {', '.join(STARTUP_COLUMNS)}) VALUES "
                f"({', '.join('?' * (len(STARTUP_COLUMNS) + 1))})",
                [(run_id, *(r.get(c) for c in STARTUP_COLUMNS)) for r in startup_rows])
        return run_id
    except sqlite3.Error as exc:
        raise HistoryError(f"history database {path}: {exc}") from None
    finally:
        db.close()


# A history file is input like any other (issue 21): a row another tool or a bad disk wrote may hold anything.
# Each row is checked into the types kvaudit wrote; a row that cannot be is skipped, and the drift says how many.
_TEXT = ("host", "status", "reason", "verdict", "startup_id", "rank", "engine", "version", "gpu_name", "model_key")
_INTS = ("tokens", "gpu", "run_id", "id", "hosts", "tp", "bytes_per_token", "page_size")
_REALS = ("weights_gib", "free_min_gib", "unexplained_gib", "kv_gib", "free_now_gib", "free_at_end_gib",
          "duration_s", "started_ts", "gpu_total_mib", "fraction", "t_gib", "post_gib", "reserve_gib", "bpt_low",
          "bpt_high", "rest_gib")


#: the largest magnitude a number kvaudit writes can have: counts (tokens, bytes per token) stay exact in a float
#: below 2**53; seconds since 1970, MiB and GiB stay far below 1e12. A larger one (1e308 in a row: diff and plan
#: overflowed, exit 70) is not a row kvaudit wrote
MAX_INT = 1 << 53
MAX_REAL = 1e12


def clean_row(row: dict) -> dict | None:
    """The row with each column of the type kvaudit writes (text printable, numbers finite, findings a list of
    codes), or None when a required one is not (a host row without a host name or status, findings not a list)."""
    from kvaudit.textsafe import printable

    out = dict(row)
    for k, v in row.items():
        if k in _TEXT:
            if v is not None and not isinstance(v, str):
                return None
            out[k] = printable(v)[:300] if isinstance(v, str) else None
        elif k in _INTS:
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or abs(v) > MAX_INT):
                return None
        elif k in _REALS:
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v != v
                                  or abs(v) > MAX_REAL):
                return None
        elif k in ("started_at", "last_run"):
            out[k] = printable(v)[:64] if isinstance(v, str) else None
    for key in ("findings", "counted"):
        if key not in row or (key == "counted" and row[key] is None):  # counted: NULL in rows before it was kept
            continue
        try:
            codes = json.loads(row[key]) if isinstance(row[key], str) else None
        except ValueError:
            codes = None
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            return None
        out[key] = [printable(c)[:100] for c in codes]
    if "host" in row and not out.get("host"):
        return None
    if "status" in row and not out.get("status"):
        return None
    return out


def _cleaned(rows) -> tuple[list[dict], int]:
    """The rows that ``clean_row`` accepts, cleaned, and how many it skipped."""
    kept = [c for c in (clean_row(dict(r)) for r in rows) if c is not None]
    return kept, len(rows) - len(kept)


def _run_rows(db: sqlite3.Connection, run_id: int) -> tuple[dict[str, dict], dict[tuple[str, Any], dict], int]:
    """A run's host and GPU rows, checked (``clean_row``), and how many were skipped as malformed."""
    db.row_factory = sqlite3.Row
    hosts, bad_hosts = _cleaned(db.execute(f"SELECT {_bounded(HOST_COLUMNS)} FROM hosts WHERE run_id = ?",
                                           (run_id,)).fetchall())
    gpus, bad_gpus = _cleaned(db.execute(f"SELECT {_bounded(GPU_COLUMNS)} FROM gpus WHERE run_id = ?",
                                         (run_id,)).fetchall())
    return ({h["host"]: h for h in hosts},
            {(g["host"], g["gpu"] if g["gpu"] is not None else g["rank"]): g for g in gpus}, bad_hosts + bad_gpus)


def _failed(status: str | None) -> bool:
    return status is not None and status.startswith("failed:")


def _streak_kind(status: object) -> str | None:
    """What a run of bad runs has in common: not audited (``failed:*``), or audited with the startup failed in its
    log (``error``); a host in either for several runs says since when."""
    if not isinstance(status, str):
        return None
    return "failed" if _failed(status) else "error" if status.split(":")[0] == "error" else None


def _news(row: dict) -> set[str]:
    """The codes whose coming or going is news: those that counted in the run (warnings and errors, not
    acknowledged: the fleet's ``findings``, kept since ux-audit2 item 11, where a MEMORY_DRIFT or an
    ORPHANED_ENGINE_PROCESS is a warning in one run and info in another), else, in a row written before that,
    the codes whose usual severity is not info."""
    counted = row.get("counted")
    return set(counted) if counted is not None else {c for c in row["findings"] if _churns(c)}


def _churns(code: str) -> bool:
    """Whether a finding's coming or going is news: an info finding (TOKENS_MATCH, RESERVE_EXPLAINS_FREE) is a
    description, and its going away when a host went down must not read as good news."""
    from kvaudit.reconcile.findings import CODES
    from kvaudit.reconcile.interface import Severity

    return CODES.get(code, Severity.WARNING) != Severity.INFO


def drift(path: str, run_id: int) -> tuple[int | None, list[Drift]]:
    """What changed in run ``run_id`` (None, [] for the first run). Each host is compared with its own last
    *successful* audit before this run (a host that failed last night is compared with the night before); a
    failing host says since when it fails instead of listing what its audit no longer shows."""
    db = connect(path)
    try:
        prev = db.execute("SELECT MAX(id) FROM runs WHERE id < ?", (run_id,)).fetchone()[0]
        if prev is None:
            return None, []
        h0, _, bad0 = _run_rows(db, prev)
        h1, g1, bad1 = _run_rows(db, run_id)
        baselines, streaks, runs_at = _baselines(db, run_id, h1)
        gpu_rows: dict[int, dict[tuple[str, Any], dict]] = {}
        base_hosts: dict[int, dict[str, dict]] = {}
        for base in set(baselines.values()):
            base_hosts[base], gpu_rows[base], bad = _run_rows(db, base)
            bad0 += bad if base != prev else 0
    except sqlite3.Error as exc:
        raise HistoryError(f"history database {path}: {exc}") from None
    finally:
        db.close()
    out: list[Drift] = []
    if bad0 + bad1:
        out.append(Drift("(history)", None, "history", None, bad0 + bad1,
                         f"history {path}: {bad0 + bad1} malformed row(s) skipped; the drift is over the rest"))
    gpus_now: dict[str, list[tuple[Any, dict]]] = {}
    for (gh, gpu), g in g1.items():
        gpus_now.setdefault(gh, []).append((gpu, g))
    for host, now in h1.items():
        last = h0.get(host)
        if last is None and base_hosts.get(baselines.get(host, -1), {}).get(host) is None:
            out.append(Drift(host, None, "status", None, now["status"], f"{host}: new in this run ({now['status']})"))
            continue
        if _failed(now["status"]):
            first, n = streaks.get(host, (run_id, 1))
            if n > 1:
                out.append(Drift(host, None, "failing", runs_at.get(first), n,
                                 f"{host}: failing since run {first} ({runs_at.get(first, '?')}), {n} runs: "
                                 f"{now['status']}"))
            elif last is not None and last["status"] != now["status"]:
                out.append(Drift(host, None, "status", last["status"], now["status"],
                                 f"{host}: status {last['status']} -> {now['status']}"))
            continue  # what a failed audit does not show has not changed: it was not seen
        first, n = streaks.get(host, (run_id, 1))
        if _streak_kind(now["status"]) == "error" and n > 1:
            out.append(Drift(host, None, "erring", runs_at.get(first), n,
                             f"{host}: in error since run {first} ({runs_at.get(first, '?')}), {n} runs: the "
                             "startup fails in its log"))
        elif last is not None and last["status"] != now["status"]:
            out.append(Drift(host, None, "status", last["status"], now["status"],
                             f"{host}: status {last['status']} -> {now['status']}"))
        rid = baselines.get(host)
        before = base_hosts.get(rid, {}).get(host) if rid is not None else None
        if rid is None or before is None:
            continue  # no (readable) successful audit before this one: nothing to compare with
        since = "" if rid == prev else f" (compared with run {rid}, its last successful audit)"
        if before.get("startup_id") and now.get("startup_id") and before["startup_id"] != now["startup_id"]:
            out.append(Drift(host, None, "restart", before["startup_id"], now["startup_id"],
                             f"{host}: restarted since the last run (a new start: {now['startup_id']}){since}"))
        if before["tokens"] != now["tokens"] and None not in (before["tokens"], now["tokens"]):
            verb = "fell" if now["tokens"] < before["tokens"] else "rose"
            out.append(Drift(host, None, "tokens", before["tokens"], now["tokens"],
                             f"{host}: KV tokens {verb} from {before['tokens']:,} to {now['tokens']:,}{since}"))
        f0, f1 = _news(before), _news(now)
        for code in sorted(f1 - f0):
            out.append(Drift(host, None, "finding_new", None, code, f"{host}: new finding {code}{since}"))
        for code in sorted(f0 - f1):
            out.append(Drift(host, None, "finding_resolved", code, None, f"{host}: {code} resolved{since}"))
        g0 = gpu_rows[rid]
        for gpu, g in gpus_now.get(host, ()):
            b = g0.get((host, gpu))
            if b is None:
                continue
            label = f"{host} GPU {gpu}" + (f" ({g['rank']})" if g["rank"] else "")
            for key, what, limit in (("free_now_gib", "free", FREE_DRIFT_GIB),
                                     ("weights_gib", "weights", WEIGHTS_DRIFT_GIB)):
                x, y = b[key], g[key]
                if x is not None and y is not None and abs(y - x) > limit:
                    out.append(Drift(host, g["gpu"], what, x, y,
                                     f"{label}: {what} {x:.2f} -> {y:.2f} GiB ({y - x:+.2f}){since}"))
    for host in sorted(set(h0) - set(h1)):
        out.append(Drift(host, None, "status", h0[host]["status"], None, f"{host}: not in this run"))
    return prev, out


def _baselines(db: sqlite3.Connection, run_id: int, hosts: dict[str, dict]
               ) -> tuple[dict[str, int], dict[str, tuple[int, int]], dict[int, str]]:
    """Per host: the run of its last successful audit before ``run_id``, and its current failing streak
    (the first failing run, how many runs); and when each of those runs started."""
    baselines: dict[str, int] = {}
    streaks: dict[str, tuple[int, int]] = {}
    wanted: set[int] = set()
    for host in hosts:
        ok = db.execute("SELECT MAX(run_id) FROM hosts WHERE host = ? AND run_id < ? AND status NOT LIKE 'failed:%'",
                        (host, run_id)).fetchone()[0]
        if isinstance(ok, int):
            baselines[host] = ok
        kind = _streak_kind(hosts[host]["status"])
        if kind is not None:
            first, n = run_id, 1
            for rid, status in db.execute("SELECT run_id, status FROM hosts WHERE host = ? AND run_id < ? "
                                          "ORDER BY run_id DESC LIMIT 1000", (host, run_id)):
                if _streak_kind(status) != kind:
                    break
                first, n = rid, n + 1
            streaks[host] = (first, n)
            wanted.add(first)
    runs_at = {}
    for rid in wanted:
        row = db.execute("SELECT started_at FROM runs WHERE id = ?", (rid,)).fetchone()
        if row and isinstance(row[0], str):
            from kvaudit.textsafe import printable

            runs_at[rid] = printable(row[0])[:64]
    return baselines, streaks, runs_at


def host_history(path: str, host: str, limit: int = 30) -> list[dict]:
    db = connect(path)
    try:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT r.id AS run_id, substr(r.started_at, 1, 64) AS started_at, "
            + _bounded(("status", "reason", "tokens", "verdict", "weights_gib", "free_min_gib", "unexplained_gib",
                        "findings"), "h.")
            + " FROM hosts h JOIN runs r ON r.id = h.run_id WHERE h.host = ? ORDER BY r.id DESC LIMIT ?",
            (host, limit)).fetchall()
    except sqlite3.Error as exc:
        raise HistoryError(f"history database {path}: {exc}") from None
    finally:
        db.close()
    return _cleaned(list(reversed(rows)))[0]  # a malformed row is skipped, not an internal error


def overview(path: str) -> tuple[list[dict], list[dict]]:
    """Every host in the history (runs it appears in, its latest status and run), and every run."""
    db = connect(path)
    try:
        db.row_factory = sqlite3.Row
        runs = _cleaned(db.execute("SELECT id, started_at, hosts, duration_s FROM runs ORDER BY id").fetchall())[0]
        hosts = _cleaned(db.execute(
            "SELECT h.host, COUNT(*) AS runs, (SELECT h2.status FROM hosts h2 WHERE h2.host = h.host "
            "ORDER BY h2.run_id DESC LIMIT 1) AS status, (SELECT r.started_at FROM runs r JOIN hosts h3 "
            "ON h3.run_id = r.id WHERE h3.host = h.host ORDER BY r.id DESC LIMIT 1) AS last_run "
            "FROM hosts h GROUP BY h.host ORDER BY h.host").fetchall())[0]
    except sqlite3.Error as exc:
        raise HistoryError(f"history database {path}: {exc}") from None
    finally:
        db.close()
    return hosts, runs


#: a value longer than this is cut inside SQLite, before Python holds it (a 300 MB row cost diff and plan 2.6 GB);
#: a column of kvaudit's is far shorter (``findings``, a JSON list of codes, gets more), so a cut value then fails
#: ``clean_row``'s check (a number column, a JSON list) or is the text cut at 300 characters that it keeps anyway
MAX_VALUE_CHARS = 1000
MAX_FINDINGS_CHARS = 64 << 10
#: the most startup rows ``plan --history`` and ``diff`` read: the latest ones (each is a startup a fleet run saw;
#: a million rows cost plan 46-89 s and 1.8 GB)
MAX_STARTUP_ROWS = 100_000
HOST_COLUMNS = ("run_id", "host", "status", "reason", "tokens", "verdict", "weights_gib", "free_min_gib",
                "unexplained_gib", "findings", "startup_id", "counted")
GPU_COLUMNS = ("run_id", "host", "gpu", "rank", "tokens", "kv_gib", "weights_gib", "free_now_gib", "free_at_end_gib",
               "unexplained_gib")


def _bounded(columns: tuple[str, ...], prefix: str = "") -> str:
    """A SELECT list whose text and blob values are cut in SQLite (numbers pass as they are)."""
    def one(c: str) -> str:
        n = MAX_FINDINGS_CHARS if c in ("findings", "counted") else MAX_VALUE_CHARS
        return (f"CASE WHEN typeof({prefix}{c}) IN ('text', 'blob') THEN substr({prefix}{c}, 1, {n}) "
                f"ELSE {prefix}{c} END AS {c}")
    return ", ".join(one(c) for c in columns)


def _startup_rows(path: str, host: str | None) -> list[dict]:
    """The ``startups`` rows (of ``host``), in run order, each checked into the types kvaudit writes (``clean_row``);
    a row that is not is skipped."""
    if not Path(path).is_file():
        raise HistoryError(f"history database {path}: no such file")
    db = connect(path)
    try:
        db.row_factory = sqlite3.Row
        where, args = ("WHERE host = ?", (host,)) if host is not None else ("", ())
        rows = [dict(r) for r in db.execute(
            f"SELECT {_bounded(('run_id',) + STARTUP_COLUMNS)} FROM startups {where} ORDER BY run_id DESC LIMIT ?",
            (*args, MAX_STARTUP_ROWS))]
        rows.reverse()
    except sqlite3.Error as exc:
        raise HistoryError(f"history database {path}: {exc}") from None
    finally:
        db.close()
    return [c for c in (clean_row(r) for r in rows) if c is not None and c.get("engine")]


def _observed(r: dict):
    from kvaudit.planning.model import Observed

    # a field the table does not keep (Observed.rocm: a replayed log's) keeps its default
    return Observed(**{k: r[k] for k in Observed.__dataclass_fields__ if k in r})


def startups(path: str, host: str | None = None) -> list:
    """The startups the history holds (of ``host``, or of every host), each once (a host audited every night with no
    restart in between is one startup: its latest row), in the order they were recorded."""
    latest: dict[tuple, dict] = {}
    for r in _startup_rows(path, host):
        key = (r["host"], r["startup_id"]) if r["startup_id"] else (r["host"], r["run_id"])
        latest.pop(key, None)  # re-inserted: the order is that of each startup's latest row
        latest[key] = r
    return [_observed(r) for r in latest.values()]


def startup_at(path: str, host: str, run_id: int):
    """The startup ``host`` ran at ``run_id`` as the history recorded it (kvaudit diff HOST@RUN): that run's row, or
    the latest before it (a run the host was down in recorded none)."""
    rows = [r for r in _startup_rows(path, host) if r["run_id"] <= run_id]
    if not rows:
        raise HistoryError(f"history {path}: no startup of {host!r} recorded at or before run {run_id}")
    return _observed(rows[-1])
