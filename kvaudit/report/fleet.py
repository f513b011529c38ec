"""The fleet at a glance: one row per host, the failures with their reasons, the drift since last run."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Sequence

from kvaudit import __version__
from kvaudit.results import Drift, FleetRun
from kvaudit.report.host import host_dict
from kvaudit.report.json import SCHEMA_VERSION, dumps
from kvaudit.report.rows import host_summary
from kvaudit.status import INTERRUPTED, label_rank, tally, tally_rank
from kvaudit.report.text import HEADLINE_LINES, capped, cell_len, colour, headline, table, wrap
from kvaudit.textsafe import md_cell
from kvaudit.verdict import FAILURE_CODES

#: hosts failing alike that the text table shows as one row
COLLAPSE_AT = 3
COLUMNS = ("host", "status", "GPUs", "tokens", "verdict", "free min", "unexpl.", "findings")
STATUS_COLOUR = {"ok": "32", "warning": "33", "partial": "33", "error": "31"}


def _f(v: Any, nd: int = 2, signed: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    if signed and round(v, nd) == 0:
        return f"+{0:.{nd}f}"  # not "-0.00": a rounding's sign says nothing
    return f"{v:+.{nd}f}" if signed else f"{v:.{nd}f}"


def _by_severity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: label_rank(r["status"]))


def counts_text(rows: list[dict[str, Any]]) -> str:
    """``2 failed, 1 warning, 17 ok (3 ignored)``: the worst first; acknowledged findings counted, as
    pip-audit counts what it skipped; hosts a Ctrl-C left unfinished counted last, as ``interrupted``."""
    counts: dict[str, int] = {}
    for r in rows:
        word = tally(r["status"], r.get("reason"))
        counts[word] = counts.get(word, 0) + 1
    ignored = sum(len(r.get("ignored") or ()) for r in rows)
    order = sorted(counts, key=tally_rank)
    return (", ".join(f"{counts[k]} {k}" for k in order) + (f" ({ignored} ignored)" if ignored else ""))


def status_cell(r: dict[str, Any]) -> str:
    """A host's status as the tables show it: ``ok (1 ignored)`` when findings were acknowledged."""
    if tally(r["status"], r.get("reason")) == INTERRUPTED:
        return INTERRUPTED
    n = len(r.get("ignored") or ())
    return f"{r['status']} ({n} ignored)" if n else r["status"]


def host_ranges(names: list[str], most: int = 6) -> str:
    """Host names as Ansible's ranges where they run on (``gpu-[01:64]``, ``gpu-[3:5], gpu-9``), in the order
    given; after ``most`` items, ``and N more``."""
    items: list[str] = []
    runs: list[tuple[str, str, int, int, int]] = []  # prefix, suffix, width (0: unpadded), first, last
    for n in names:
        m = re.fullmatch(r"(.*?)(\d+)(\D*)", n)
        if m:
            pre, digits, suf = m.groups()
            width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
            last = runs[-1] if runs else None
            if last and last[:2] == (pre, suf) and last[4] + 1 == int(digits) and (
                    len(digits) == last[2] if last[2] else str(int(digits)) == digits):
                runs[-1] = (pre, suf, last[2], last[3], int(digits))  # gpu-09, gpu-10: one padded run
                continue
            runs.append((pre, suf, width, int(digits), int(digits)))
        else:
            runs.append((n, "", -1, 0, 0))
    for pre, suf, width, a, b in runs:
        if width < 0:
            items.append(pre)
        elif a == b:
            items.append(f"{pre}{str(a).zfill(width)}{suf}")
        else:
            items.append(f"{pre}[{str(a).zfill(width)}:{str(b).zfill(width)}]{suf}")
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def _cause(r: dict[str, Any]) -> str:
    """A failed host's error without the host's own name and addresses: what hosts failing alike share."""
    text = r.get("error") or ""
    for name in sorted({r["host"], r.get("target") or ""} - {""}, key=len, reverse=True):
        text = text.replace(name, "HOST")
    text = re.sub(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b", "ADDRESS", text)
    return re.sub(r"^HOST:\s*", "", text)


def failure_groups(rows: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """The hosts not audited, grouped by reason and cause (64 hosts refusing the connection are one group), the
    largest first; Ctrl-C's unfinished hosts are one group of their own."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["reason"]:
            cause = "Ctrl-C before it finished" if r["reason"] == INTERRUPTED else _cause(r)
            groups.setdefault((r["reason"], cause), []).append(r)
    return sorted(((k[0], k[1], v) for k, v in groups.items()),
                  key=lambda g: (g[0] == INTERRUPTED, -len(g[2]), g[0]))


def _failure_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for reason, cause, group in failure_groups(rows):
        if len(group) == 1:
            r = group[0]
            out.append(f"{r['host']}: {r['reason']}: {r['error']}")
        else:
            out.append(f"{len(group)} hosts ({host_ranges([r['host'] for r in group])}): {reason}: {cause}")
    return out


def list_hosts_text(hosts: Sequence[Any]) -> str:
    """``--list-hosts``: what ``ansible --list-hosts`` prints, the hosts --limit selects, in inventory order."""
    return f"  hosts ({len(hosts)}):\n" + "".join(f"    {h.name}\n" for h in hosts)



def _beyond_headline(r: dict[str, Any]) -> list[str]:
    """A host's reasons the headline does not already give (its own finding code, its cause). Under a failed
    start's headline, a failure finding's clauses that quote the same line again are left out (ux-audit2 item
    18: the engine's error was printed three times); what else it says (the fraction the formula needs) stays."""
    head = r["headline"]
    line = re.search(r"\(line (\d+)\)", head) if head.startswith("ERROR startup failed") else None
    out = []
    for w in r.get("why_items") or []:
        code = w.split(":", 1)[0]
        if code in head or w in head or w.startswith("not checked:"):  # an unchecked host's headline is that
            continue
        if line is not None and code in FAILURE_CODES:
            quoted = f"line {line.group(1)}"
            rest = [c for c in w.split(":", 1)[1].strip().split("; ") if quoted not in c]
            if not rest:
                continue
            w = f"{code}: {'; '.join(rest)}"
        out.append(w)
    return out


def _headline_with_more(r: dict[str, Any]) -> str:
    """The host's headline; a failed start's with ``(+N more)`` for its other findings, as a warning's has."""
    head = r["headline"]
    n = len(r.get("findings") or ()) - 1
    if head.startswith("ERROR ") and n > 0 and "more)" not in head:
        return f"{head} (+{n} more)"
    return head


def summary_rows(run: FleetRun) -> list[dict[str, Any]]:
    return [host_summary(f.name, h) for f, h in run.results]


FIRST_RUN = "first run: the history starts here; the next run says what changed since this one"


def _fit(text: str, width: int, middle: bool = False) -> str:
    """``text`` in ``width`` terminal cells (rich's measure: a wide character is two): cut at the end ("…"), or in
    the middle for names and paths (both ends stay readable; nothing is split at a hyphen onto another line)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    if middle:
        head = _cells_from_start(text, (width - 1) // 2)
        return head + "…" + _cells_from_end(text, width - 1 - cell_len(head))
    return _cells_from_start(text, width - 1) + "…"


def _cells_from_start(text: str, cells: int) -> str:
    out = ""
    for ch in text:
        if cell_len(out + ch) > cells:
            break
        out += ch
    return out


def _cells_from_end(text: str, cells: int) -> str:
    return _cells_from_start(text[::-1], cells)[::-1]


def fitted(header: tuple[str, ...], body: Sequence[tuple[str, ...]], width: int,
           indent: int = 2) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The header and rows made to fit ``width`` cells (no row wraps on an 80- or 60-column terminal), the least
    telling first: the verdict column (the status and findings say it), the findings list as its first code and
    how many more (the first is the headline's), the unexplained and GPU-count columns, a host name longer than 32
    cells cut in the middle (then down to 20), the ``free min`` column, a failed host's status as its reason
    alone (``unreachable`` for ``failed:unreachable``: the reason is what the row is read for, and no reason is a
    status word), the codes cut to 12 cells, a host name cut down to 16 and then 12 cells, and only then a
    failure's reason (the status ``failed``) and the codes cut further (ux-audit2 item 5: at 60 columns names of
    18 cells stay whole).
    Numbers are never cut. Widths in terminal cells."""
    head, rows = list(header), [list(r) for r in body]

    def total() -> int:
        cols = [max(cell_len(h), *(cell_len(r[i]) for r in rows)) if rows else cell_len(h)
                for i, h in enumerate(head)]
        return indent + sum(cols) + 2 * (len(cols) - 1)

    def drop(name: str) -> None:
        if name in head:
            i = head.index(name)
            del head[i]
            for r in rows:
                del r[i]

    def shorten(name: str, fn) -> None:
        if name in head:
            i = head.index(name)
            for r in rows:
                r[i] = fn(r[i])

    def host_to(cells: int) -> None:
        cur = max(cell_len(r[0]) for r in rows) if rows else 0
        keep = max(cells, cur - (total() - width))
        shorten(head[0], lambda c: _fit(c, keep, True))

    def first_code(cell: str) -> str:
        codes = cell.split(",")
        return cell if len(codes) == 1 else f"{codes[0]} +{len(codes) - 1}"

    def findings_to(cells: int) -> None:
        if "findings" in head:
            i = head.index("findings")
            cur = max(cell_len(head[i]), *(cell_len(r[i]) for r in rows)) if rows else cell_len(head[i])
            keep = max(cells, cur - (total() - width))
            shorten("findings", lambda c: _fit(c, keep))

    status_at = head.index("status") if "status" in head else None
    statuses = [r[status_at] for r in rows] if status_at is not None else []

    def status_as(fn) -> None:  # from the status as it was, not as an earlier step left it
        if "status" in head:
            i = head.index("status")
            for r, was in zip(rows, statuses):
                r[i] = fn(was)

    steps = (lambda: drop("verdict"), lambda: shorten("findings", first_code), lambda: drop("unexpl."),
             lambda: drop("GPUs"), lambda: host_to(32), lambda: host_to(20), lambda: drop("free min"),
             lambda: status_as(lambda c: re.sub(r"^[a-z]+:(?=\S)", "", c)), lambda: findings_to(12),
             lambda: host_to(16), lambda: host_to(12), lambda: status_as(lambda c: re.sub(r":\S+", "", c)))
    for step in steps:
        if total() <= width:
            break
        step()
    over = total() - width
    if over > 0 and "findings" in head:  # the last resort: the codes themselves, cut at the end
        i = head.index("findings")
        cur = max(cell_len(head[i]), *(cell_len(r[i]) for r in rows)) if rows else cell_len(head[i])
        keep = max(8, cur - over)
        shorten("findings", lambda c: _fit(c, keep))
    return tuple(head), [tuple(r) for r in rows]


def _as_why_says(r: dict[str, Any]) -> list[str]:
    """A host's finding codes in the order its "Why not ok" entry gives them (the headline's first), not
    alphabetically: the table's first code is the one the headline names."""
    order = [item.split(":", 1)[0] for item in r.get("why_items") or ()]
    return sorted(r["findings"], key=lambda c: (order.index(c) if c in order else len(order), c))


def _left_aligned_last(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:  # the header first
    """The last column (the findings, words) padded on the right: :func:`table` right-aligns it with the numbers,
    which pushed short codes far from the column they belong to."""
    if not rows:
        return rows
    w = max(cell_len(r[-1]) for r in rows)
    return [r[:-1] + (r[-1] + " " * (w - cell_len(r[-1])),) for r in rows]


def render_text(run: FleetRun, drift: list[Drift] | None = None, color: bool = False, first_run: bool = False,
                width: int = 120) -> str:
    rows = summary_rows(run)
    L = [colour(x, "1", color) for x in headline(  # the counts first: they are what the line is read for
        f"kvaudit fleet: {counts_text(rows)} - {len(rows)} host{'s' if len(rows) != 1 else ''} in "
        f"{run.duration_s:.1f} s (parallel {run.parallel})", width)]
    if run.deadline_hit:
        L.append(colour("  the run deadline passed before every host finished", "31", color))
    body = []
    collapsed = {id(r): group for _, _, group in failure_groups(rows) if len(group) >= COLLAPSE_AT for r in group}
    for r in rows:
        group = collapsed.get(id(r))
        if group is not None and r is not group[0]:
            continue  # one row for a group of hosts failing alike
        name = f"{host_ranges([x['host'] for x in group], 2)} ({len(group)})" if group else r["host"]
        body.append((name, status_cell(r), str(r["gpus"]), _f(r["tokens"]), r["verdict"] or "-",
                     _f(r["free_min_gib"]), _f(r["unexplained_gib"], signed=True),
                     ",".join(_as_why_says(r)) or "-"))
    head, shown = fitted(COLUMNS, body, width)
    padded = _left_aligned_last([head] + shown)
    lines = table(padded[0], padded[1:], left=2)
    if color:  # the status cell coloured in place (padding measured before the escape codes)
        at = head.index("status")
        for i, row in enumerate(shown, 1):
            st = row[at].split(" (")[0]
            code = STATUS_COLOUR.get(st.split(":")[0], "31")
            lines[i] = re.sub(rf"(?<=  ){re.escape(st)}(?= )", colour(st, code, True), lines[i], count=1)
    L.extend(lines)
    failed = [r for r in rows if r["reason"]]
    if failed:
        L += ["", colour("Not audited", "1", color)]
        for line in _failure_lines(failed):
            L.extend(wrap(line, width=width))
    others = [r for r in _by_severity(rows) if not r["reason"] and r["status"] != "ok"]
    if others:
        L += ["", colour("Why not ok", "1", color)]
        for r in others:  # each host's entry opens with its headline; the other findings follow
            # the headline is whole (JSON, HTML); the terminal gives it 3 lines, as a report opens with
            L.extend(capped(wrap(f"{r['host']}: {_headline_with_more(r)}", width=width), HEADLINE_LINES, width))
            for item in _beyond_headline(r):  # what the headline does not already say, once each
                L.extend(wrap(f"also {item}", indent="    ", width=width))
    if drift:
        L += ["", colour("Since the last run", "1", color)]
        for d in drift:
            L.extend(wrap("- " + d.message, width=width))
    elif first_run:
        L += ["", f"Since the last run: {FIRST_RUN}."]
    elif drift is not None:
        L += ["", "Since the last run: no change."]
    return "\n".join(L) + "\n"


def render_markdown(run: FleetRun, drift: list[Drift] | None = None, first_run: bool = False) -> str:
    rows = summary_rows(run)
    L = ["# kvaudit fleet report", "",
         f"{len(rows)} host{'s' * (len(rows) != 1)} ({counts_text(rows)}), {run.started_at}, "
         f"{run.duration_s:.1f} s.", "",
         "| " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * 5 + "---|"]
    for r in rows:
        L.append(f"| {md_cell(r['host'])} | {status_cell(r)} | {r['gpus']} | {_f(r['tokens'])} | "
                 f"{r['verdict'] or '–'} | {_f(r['free_min_gib'])} | {_f(r['unexplained_gib'], signed=True)} | "
                 f"{', '.join('`%s`' % c for c in _as_why_says(r)) or '–'} |")
    failed = [r for r in rows if r["reason"]]
    if failed:
        L += ["", "## Not audited", ""]
        for reason, cause, group in failure_groups(failed):
            if len(group) == 1:
                L.append(f"- **{md_cell(group[0]['host'])}** ({reason}): {md_cell(group[0]['error'])}")
            else:
                L.append(f"- **{len(group)} hosts** ({md_cell(host_ranges([r['host'] for r in group]))}) ({reason}): "
                         f"{md_cell(cause)}")
    others = [r for r in _by_severity(rows) if not r["reason"] and r["status"] != "ok"]
    if others:
        L += ["", "## Why not ok", ""]
        for r in others:  # the headline, then what it does not already say, once each
            L.append(f"- **{md_cell(r['host'])}**: {md_cell(_headline_with_more(r))}")
            L += [f"  - also {md_cell(item)}" for item in _beyond_headline(r)]
    if drift:
        L += ["", "## Since the last run", ""] + [f"- {md_cell(d.message)}" for d in drift]
    elif first_run:
        L += ["", "## Since the last run", "", FIRST_RUN + "."]
    return "\n".join(L) + "\n"


def render_json(run: FleetRun, drift: list[Drift] | None = None, previous_run: int | None = None,
                first_run: bool = False) -> str:
    return "".join(iter_json(run, drift, previous_run, first_run))


#: stands in for the hosts while the rest of the document is laid out (a host name can never be this string:
#: printable() strips control characters from everything a host sends)
_HOSTS = "\x00kvaudit-hosts\x00"


def iter_json(run: FleetRun, drift: list[Drift] | None = None, previous_run: int | None = None,
              first_run: bool = False) -> Iterator[str]:
    """The fleet document in pieces, one host's at a time (issue 23, item 4): the whole document is never held
    as one string or one tree, so writing it takes memory for one host, whatever the number of hosts. The bytes
    are exactly those of ``dumps`` of the whole document."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kvaudit_version": __version__,
        "run": {"started_at": run.started_at, "duration_s": run.duration_s, "parallel": run.parallel,
                "hosts": len(run.results), "failed": len(run.failed), "deadline_hit": run.deadline_hit,
                "previous_run_id": previous_run, "first_run": first_run, "interrupted": run.interrupted},
        "hosts": [_HOSTS] if run.results else [],
        "drift": [{"host": d.host, "gpu": d.gpu, "what": d.what, "before": d.before, "after": d.after,
                   "message": d.message} for d in (drift or [])],
    }
    text = dumps(doc)
    if not run.results:
        yield text
        return
    marker = "    " + json.dumps(_HOSTS)
    head, tail = text.split(marker + "\n", 1)
    yield head
    for i, (f, h) in enumerate(run.results):
        d = host_dict(h)
        d["name"] = f.name
        d["summary"] = host_summary(f.name, h)
        one = dumps(d).rstrip("\n").replace("\n", "\n    ")
        yield ("    " if i == 0 else ",\n    ") + one
    yield "\n" + tail
