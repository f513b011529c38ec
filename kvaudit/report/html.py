"""A self-contained HTML fleet report for on-call (no network needed to read it): provenance (version, command
line, inventory, time), the fleet table problems first, then each host: problems open, healthy hosts
collapsed; a bar per GPU (weights / KV / graphs / draft / reserve-side tables / free at end / unexplained), the
findings, and with ``--history`` a trend chart per host (KV tokens, free memory, unexplained over the runs,
inline SVG)."""

from __future__ import annotations

from html import escape
from typing import Any

from kvaudit.results import Drift, FleetRun
from kvaudit.report.rows import findings, gpu_rows, host_summary
from kvaudit.status import label_rank
from kvaudit.report.fleet import counts_text, status_cell

SEGMENTS = (  # (key in the bar, label, colour)
    ("weights_gib", "weights", "#4c72b0"),
    ("kv_gib", "KV cache", "#55a868"),
    ("graphs_gib", "CUDA graphs", "#c44e52"),
    ("draft_gib", "draft", "#8172b2"),
    ("other_gib", "tables & other", "#937860"),
    ("free_at_end_gib", "free at end", "#dddddd"),
    ("unexplained_gib", "unexplained", "#ff9f1c"),
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:right}
th{cursor:pointer;background:#f6f6f6;position:sticky;top:0;text-align:left}td:first-child,td.l{text-align:left}
td.why{max-width:420px;font-size:12px;color:#555}
.finding,.headline,td.why,summary small{overflow-wrap:anywhere}
#filter{margin:6px 0;padding:4px 6px;font-size:13px;width:260px;max-width:100%}
.s-ok{color:#2a7a2a}.s-warning,.s-partial{color:#a66d00}.s-error,.s-failed{color:#b00020;font-weight:600}
.bar{display:flex;height:14px;width:520px;border:1px solid #ccc}.bar div{height:100%}
.legend span{display:inline-block;margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.finding{font-size:13px;margin:2px 0}.prov{font-size:12px;color:#555}.prov code{font-size:12px}
details>summary{cursor:pointer;font-weight:600;margin:10px 0 4px}.trend{margin:6px 0}.trend text{font-size:10px;fill:#555}.sev-error{color:#b00020}.sev-warning{color:#a66d00}.sev-info{color:#555}
td:first-child,td.l.s-ok,td.l.s-warning,td.l.s-partial,td.l.s-error,td.l.s-failed{white-space:nowrap}
.wide{overflow-x:auto;max-width:100%}
@media (max-width:640px){body{margin:8px}table{font-size:12px}th,td{padding:3px 4px}td.why{max-width:none}
.bar{width:100%}.trend{width:100%}.narrow-hide{display:none}
#fleet td:first-child{white-space:normal;overflow-wrap:anywhere;max-width:32vw}#fleet td.why{max-width:44vw}}
"""

JS = """
document.querySelectorAll('table.sortable th').forEach(function(th, i){
  th.addEventListener('click', function(){
    var tb = th.closest('table').tBodies[0], rows = Array.from(tb.rows), asc = th.dataset.asc !== '1';
    rows.sort(function(a, b){
      var x = a.cells[i].dataset.v || a.cells[i].textContent, y = b.cells[i].dataset.v || b.cells[i].textContent;
      var nx = Number(x), ny = Number(y);
      // numbers as numbers; names in natural order (gpu-2 before gpu-10)
      var c = (x !== '' && y !== '' && !isNaN(nx) && !isNaN(ny)) ? nx - ny
              : x.localeCompare(y, undefined, {numeric: true});
      return asc ? c : -c;
    });
    th.dataset.asc = asc ? '1' : '0'; rows.forEach(function(r){ tb.appendChild(r); });
  });
});
var filter = document.getElementById('filter');
if (filter) filter.addEventListener('input', function(){
  var q = filter.value.toLowerCase();
  document.querySelectorAll('#fleet tbody tr').forEach(function(r){
    r.style.display = r.textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
  });
});
"""


def _v(x: Any, nd: int = 2) -> str:
    if x is None:
        return "–"
    return f"{x:,}" if isinstance(x, int) else f"{x:.{nd}f}"


def _bar(r: dict[str, Any], total: float) -> str:
    parts = []
    known = 0.0
    for key, _, _ in SEGMENTS:
        if key != "other_gib" and isinstance(r.get(key), (int, float)) and key != "unexplained_gib":
            known += r[key]
    values = dict(r)
    values["other_gib"] = max(0.0, (r.get("pre_load_free_gib") or 0) - known - max(0.0, r.get("unexplained_gib") or 0))
    values["unexplained_gib"] = abs(r.get("unexplained_gib") or 0)
    for key, label, colour in SEGMENTS:
        v = values.get(key)
        if not isinstance(v, (int, float)) or v <= 0 or total <= 0:
            continue
        parts.append(f'<div title="{escape(label)}: {v:.2f} GiB" style="width:{100 * v / total:.3f}%;'
                     f'background:{colour}"></div>')
    return '<div class="bar">' + "".join(parts) + "</div>"


#: the numbers that make two GPUs "the same" in the report (to 0.01 GiB): merged into one row
_SAME = ("kv_gib", "weights_gib", "graphs_gib", "draft_gib", "reserve_gib", "unexplained_gib", "pre_load_free_gib",
         "free_at_end_gib", "free_now_gib", "before_t_gib", "foreign_gib", "status")


def _merged_rows(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive GPUs with the same numbers (to the hundredth of a GiB) as one row: eight identical H200s
    read as "0-7", as the terminal shows them; any difference keeps a GPU on its own row."""
    def key(r: dict[str, Any]) -> tuple:
        return tuple(round(r[k], 2) if isinstance(r.get(k), float) else r.get(k) for k in _SAME)

    groups: list[list[dict[str, Any]]] = []
    for r in rows:
        if groups and key(groups[-1][-1]) == key(r):
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def _natural(name: str) -> tuple:
    """A host name's sort key with its numbers as numbers (gpu-2 before gpu-10)."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _signed(x: Any) -> str:
    return "–" if x is None else "+0.00" if round(x, 2) == 0 else f"{x:+.2f}"  # not "-0.00"


def _brief(why: str, width: int = 110) -> str:
    """The table's "why not ok": the codes and the first words; the whole text is the cell's tooltip and is
    under the host below."""
    return why if len(why) <= width else why[:width - 1].rsplit(" ", 1)[0] + " …"


def _span(values: list[Any]) -> str:
    vals = [str(v) for v in values if v is not None]
    if not vals:
        return "–"
    return vals[0] if len(vals) == 1 else f"{vals[0]}–{vals[-1]} ({len(vals)})"


def _trend(runs: list[dict[str, Any]]) -> str:
    """A small inline SVG per quantity (KV tokens, free min GiB, unexplained GiB) over the host's runs."""
    charts = []
    for key, label in (("tokens", "KV tokens"), ("free_min_gib", "free min GiB"), ("unexplained_gib", "unexplained GiB")):
        pts = [(i, r[key]) for i, r in enumerate(runs) if isinstance(r.get(key), (int, float))]
        if len(pts) < 2:
            continue
        lo, hi = min(v for _, v in pts), max(v for _, v in pts)
        span = (hi - lo) or 1.0
        w, h, n = 180, 40, max(1, len(runs) - 1)
        xy = " ".join(f"{4 + (w - 8) * i / n:.1f},{h - 4 - (h - 8) * (v - lo) / span:.1f}" for i, v in pts)
        last = pts[-1][1]
        # the range is said beside the line: a flat-looking line over 159,000..159,300 is not a flat fleet
        rng = f"{_v(lo)}–{_v(hi)}" if hi != lo else "unchanged"
        charts.append(f"<svg class='trend' width='{w + 150}' height='{h}' viewBox='0 0 {w + 150} {h}' role='img' "
                      f"aria-label='{escape(f'{label}: {rng}, last {_v(last)}')}'>"
                      f"<polyline fill='none' stroke='#4c72b0' stroke-width='1.5' points='{xy}'/>"
                      f"<text x='{w + 2}' y='12'>{escape(label)}: {escape(_v(last))}</text>"
                      f"<text x='{w + 2}' y='26'>range {escape(rng)}</text></svg>")
    return ("<div>" + "".join(charts) + f"<span class='prov'> over {len(runs)} runs</span></div>") if charts else ""


def render(run: FleetRun, drift: list[Drift] | None = None, provenance: dict[str, str] | None = None,
           trends: dict[str, list[dict[str, Any]]] | None = None) -> str:
    summaries = [host_summary(f.name, h) for f, h in run.results]
    fleet = ((provenance or {}).get("inventory") or "").rstrip("/").rsplit("/", 1)[-1]  # the inventory's name
    worst = counts_text(summaries).split(",")[0]  # the worst status first, with its count
    title = f"kvaudit {escape(fleet)}: {escape(worst)} of {len(summaries)} host{'s' * (len(summaries) != 1)}"
    H = ["<!doctype html><html><head><meta charset='utf-8'>"
         f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{title}</title>",
         f"<style>{CSS}</style></head><body>",
         f"<h1>kvaudit fleet report{': ' + escape(fleet) if fleet else ''}</h1><p>{len(summaries)} "
         f"host{'s' * (len(summaries) != 1)} ({escape(counts_text(summaries))}), started "
         f"{escape(run.started_at)}, {run.duration_s:.1f} s, {len(run.failed)} not audited.</p>",
         "<p class='prov'>" + " · ".join(f"{escape(k)}: <code>{escape(v)}</code>"
                                         for k, v in (provenance or {}).items()) + "</p>",
         "<h2>Fleet</h2>"
         + ("<input id='filter' type='search' placeholder='filter hosts, statuses, codes' aria-label='filter'>"
            if len(summaries) > 20 else "")
         + "<div class='wide'><table class='sortable' id='fleet'><thead><tr>"
         # on a phone the host, its status and why stay; the numbers are one tap away, under the host
         + "".join(f"<th{' class=narrow-hide' if hide else ''}>{c}</th>" for c, hide in (
             ("host", False), ("status", False), ("why not ok", False), ("GPUs", True), ("tokens", True),
             ("verdict", True), ("free min GiB", True), ("unexplained GiB", True), ("errors", True),
             ("warnings", True), ("findings", True)))
         + "</tr></thead><tbody>"]
    for s in sorted(summaries, key=lambda s: (label_rank(s["status"]), _natural(s["host"]))):  # problems first
        st = s["status"].split(":")[0]
        H.append(f"<tr><td><a href='#h-{escape(s['host'])}'>{escape(s['host'])}</a></td>"
                 f"<td class='l s-{escape(st)}' data-v='{label_rank(s['status'])}'>{escape(status_cell(s))}</td>"
                 f"<td class='l why' title='{escape(s['why'])}'>{escape(_brief(s['why']) or '–')}</td>"
                 f"<td class='narrow-hide'>{s['gpus']}</td>"
                 f"<td class='narrow-hide' data-v='{s['tokens'] or 0}'>{_v(s['tokens'])}</td>"
                 f"<td class='l narrow-hide'>{escape(s['verdict'] or '–')}</td>"
                 f"<td class='narrow-hide'>{_v(s['free_min_gib'])}</td>"
                 f"<td class='narrow-hide'>{_signed(s['unexplained_gib'])}</td>"
                 f"<td class='narrow-hide'>{s['errors']}</td><td class='narrow-hide'>{s['warnings']}</td>"
                 f"<td class='l narrow-hide'>{escape(', '.join(s['findings']) or '–')}</td></tr>")
    H.append("</tbody></table></div>")
    if drift:
        H.append("<h2>Since the last run</h2><ul>" + "".join(f"<li>{escape(d.message)}</li>" for d in drift) + "</ul>")
    H.append("<h2>GPUs</h2><p class='legend'>" + "".join(
        f"<span><i style='background:{c}'></i>{escape(l)}</span>" for _, l, c in SEGMENTS) + "</p>")
    order = sorted(zip(run.results, summaries), key=lambda x: (label_rank(x[1]["status"]), _natural(x[0][0].name)))
    for (f, h), s in order:  # problems first; each host's cause said once, in its headline
        healthy = s["status"] == "ok"
        H.append(f"<details id='h-{escape(f.name)}'{'' if healthy else ' open'}><summary>{escape(f.name)} "
                 f"<small class='s-{escape(s['status'].split(':')[0])}'>{escape(s['status'])}</small></summary>")
        H.append(f"<p class='headline s-{escape(s['status'].split(':')[0])}'>{escape(s['headline'])}</p>")
        if trends and trends.get(f.name):
            H.append(_trend(trends[f.name]))
        if h.error is not None:
            H.append("</details>")
            continue
        H.append("<table><thead><tr><th>GPU</th><th>rank</th><th>before T GiB</th><th>T GiB</th>"
                 "<th>memory at startup (from T)</th><th>free now GiB</th><th>unexplained GiB</th></tr></thead><tbody>")
        for group in _merged_rows(gpu_rows(f.name, h)):
            r = group[0]
            total = r["pre_load_free_gib"]
            gpus = _span([x["gpu"] for x in group])
            ranks = _span([x["rank"] for x in group])
            H.append(f"<tr><td>{escape(gpus)}</td><td class='l'>{escape(ranks)}</td><td>{_v(r['before_t_gib'])}</td>"
                     f"<td>{_v(total)}</td><td class='l'>{_bar(r, total or 0)}</td><td>{_v(r['free_now_gib'])}</td>"
                     f"<td>{_v(r['unexplained_gib'])}</td></tr>")
        H.append("</tbody></table>")
        for fi in findings(h):
            H.append(f"<p class='finding sev-{fi.severity.value}'><b>{escape(fi.code)}</b> "
                     f"({fi.severity.value}{', ignored' if fi.ignored else ''}): {escape(fi.message)}</p>")
        for p in h.partial:
            H.append(f"<p class='finding sev-warning'>partial: {escape(p)}</p>")
        H.append("</details>")
    H.append(f"<script>{JS}</script></body></html>")
    return "\n".join(H) + "\n"
