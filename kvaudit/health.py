"""The health-check contract (``kvaudit check TARGET --health-check``): one JSON verdict and an exit status a
scheduler's node health checker understands (Slurm's HealthCheckProgram / NHC, Kubernetes Node Problem
Detector's custom plugins, Nagios-style monitors). Documented in docs/json.md and docs/fleet.md.

Three renderings of one verdict, each in the contract its reader keeps (issue 37, item 1):

- ``--exit-codes nagios`` (Nagios, Icinga, NHC, Slurm): the Nagios plugin output of the Monitoring Plugins
  Development Guidelines: a first line ``KVAUDIT <STATE> - <what> | <perfdata>`` whose text before ``|`` is at most
  80 bytes, then one line per problem (Nagios' "long output");
- ``--exit-codes npd`` (Kubernetes Node Problem Detector's custom plugins): that first line's text alone, because
  NPD keeps the whole stdout, trimmed, cut at ``max_output_length`` bytes (80 in its examples;
  pkg/custompluginmonitor/plugin/plugin.go, ``Plugin.run``) as the condition's message;
- ``--format json``: the JSON document (schema ``kvaudit.health/1``, docs/schemas/health.schema.json).

The rule that makes it safe to drain on: only a **node** problem may be critical. A node problem is one the node
itself has, whatever the engine's settings: memory on its GPUs held by another process, memory occupied before
the engine started, GPUs missing or unreadable. Everything about the engine's own settings (a pool that does not
follow the formula, idle memory, a failed startup's configuration) is a **config** problem: it warns, and it
never drains a node. A host that could not be audited is **unknown**.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Any

from kvaudit.collect.interface import SMI_FAILED, SMI_MISSING
from kvaudit.reconcile.interface import Finding, Severity
from kvaudit.textsafe import printable
from kvaudit.verdict import counted, judge_host
from kvaudit.record import record

SCHEMA = "kvaudit.health/1"
#: a health check answers within this many seconds unless --timeout says otherwise. Schedulers run it often and
#: bound it themselves: NPD's custom plugins default to (and its examples use) a 5 s timeout
#: (pkg/custompluginmonitor/types/config.go, defaultGlobalTimeout), NHC's default is 30 s. 4 s for the host leaves
#: a second of NPD's 5 for the interpreter's start and the verdict (bench/health_check.py measures the whole run)
HEALTH_DEADLINE_S = 4.0
#: NPD's default plugin timeout, the one its examples use: the health check's time is measured against it
NPD_TIMEOUT_S = 5.0
#: NPD's default max_output_length (pkg/custompluginmonitor/types/config.go, defaultMaxOutputLength): the status
#: text is cut to this many bytes there, so kvaudit writes it no longer
STATUS_TEXT_BYTES = 80

#: findings about the node itself (kvaudit.reconcile.live): the GPUs and what else runs on them
NODE_CODES = ("FOREIGN_PROCESS", "OCCUPIED_AT_STARTUP", "GPU_COUNT_MISMATCH", "UNATTRIBUTED_GPU_MEMORY",
              "ORPHANED_ENGINE_PROCESS", "IDLE_TENANT_MEMORY")
#: a pseudo-code for GPUs that could not be read (nvidia-smi missing or failing, no readings in a pod)
NO_GPU_READINGS = "GPU_READINGS_MISSING"

#: what the collector says when a host's GPUs could not be read
UNREADABLE = (SMI_MISSING, SMI_FAILED)

#: what to do, per finding, in one sentence (the finding's own message says what was seen). Only where one
#: direction is right whatever the finding's cause: a failed start, idle memory or a pool off its formula have
#: causes that call for opposite changes (SGLang's "Not enough memory" needs a larger fraction, weights that do
#: not fit need more GPUs, a pool capped by --max-total-tokens needs the cap raised, unified memory no larger
#: fraction), so their line points at the finding, which names the change for its cause
ACTIONS = {
    "FOREIGN_PROCESS": "stop or move the other process on the GPU (nvidia-smi lists it); a running engine keeps "
                       "its pool, so restart it only if it started while that process held the memory",
    "OCCUPIED_AT_STARTUP": "free the GPU memory that was held before the engine started (a stale process, "
                           "another tenant), then restart the engine",
    "GPU_COUNT_MISMATCH": "check that every GPU is visible and healthy (nvidia-smi -L, CUDA_VISIBLE_DEVICES, "
                          "the driver's log)",
    "UNATTRIBUTED_GPU_MEMORY": "find what holds the GPU memory no process accounts for (nvidia-smi, the driver)",
    "ORPHANED_ENGINE_PROCESS": "kill the engine processes an earlier start left (the finding names the command)",
    "IDLE_TENANT_MEMORY": "resume or end the idle process holding the GPU (the finding names the command)",
    "UNIFIED_PAGE_CACHE": "drop the page cache before the next start: sync; echo 3 | sudo tee /proc/sys/vm/drop_caches",
    NO_GPU_READINGS: "check the NVIDIA driver and nvidia-smi on the node",
    "STARTUP_FAILED": "read the quoted error (kvaudit check shows its line) and restart after fixing its cause",
    "NOT_ENOUGH_MEMORY": "make the change the finding names for its cause (kvaudit check TARGET shows it in full: "
                         "a fraction, the context length, more GPUs), then restart",
    "TOKENS_MISMATCH": "compare the engine's settings with the log's (kvaudit check shows the formula)",
    "UNUSED_MEMORY": "use the idle memory as the finding says (kvaudit whatif sizes a change before a restart)",
    "LOW_HEADROOM": "lower the engine's memory fraction: little is left for activations",
}
CONFIG_ACTION = "review the engine's settings (kvaudit check TARGET shows the finding in full)"

#: exit statuses per scale: (ok, config warning, node problem, unknown)
SCALES = {"nagios": (0, 1, 2, 3), "npd": (0, 0, 1, 2)}


@record
class Problem:
    code: str
    severity: str
    problem: str  # node | config
    message: str
    action: str
    fields: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "severity": self.severity, "problem": self.problem, "message": self.message,
                "action": self.action}


@record
class Health:
    """The verdict. ``state``: ok | warning (config problems only) | critical (a node problem) | unknown."""

    host: str
    engine: str | None
    engine_version: str | None
    state: str
    headline: str
    problems: tuple[Problem, ...]
    ignored: int
    kv_tokens: int | None = None
    #: why an unknown host could not be judged, its cause first (the status line's text when no problem is named)
    detail: str | None = None

    def exit_status(self, scale: str) -> int:
        ok, warning, critical, unknown = SCALES[scale]
        return {"ok": ok, "warning": warning, "critical": critical, "unknown": unknown}[self.state]

    def as_dict(self, scale: str) -> dict[str, Any]:
        return {"schema": SCHEMA, "host": self.host, "engine": self.engine, "engine_version": self.engine_version,
                "state": self.state, "exit_status": self.exit_status(scale), "exit_codes": scale,
                "headline": self.headline, "node_problems": sum(p.problem == "node" for p in self.problems),
                "config_problems": sum(p.problem == "config" for p in self.problems), "ignored": self.ignored,
                "problems": [p.as_dict() for p in self.problems]}


def _problem(f: Finding) -> Problem:
    kind = "node" if f.code in NODE_CODES else "config"
    return Problem(f.code, f.severity.value, kind, f.message, ACTIONS.get(f.code, CONFIG_ACTION), dict(f.fields))


def _is_place(part: str, host: str) -> bool:
    return "://" in part or "@" in part or part.startswith("/") or part in (host, "local")


def cause_first(reason: str, message: str, host: str = "") -> str:
    """A failure in the order a status line of 80 bytes keeps: the reason, the cause, then the place it was
    tried (a URL, user@host:port, a path: on-call knows it already), as the last "; " clause, which
    :func:`_cut` drops first. ``http://h:1/server_info: Connection refused`` -> ``Connection refused; http://...``"""
    parts = message.split(": ")
    if len(parts) > 1 and _is_place(parts[0], host):
        return f"{reason}: {': '.join(parts[1:])}; {parts[0]}"
    return f"{reason}: {message}"


def not_run(host: str, cause: str) -> Health:
    """The verdict of a health check that did not run (refused settings, a usage error, a bug): unknown, with
    the cause on stdout in the scale's contract, not only on stderr (Nagios shows "(No output on stdout)")."""
    return Health(host, None, None, "unknown", f"FAILED not run: {cause}", (), 0,
                  detail=cause_first("not run", cause, host))


def assess(host: str, h: Any) -> Health:
    """The health of one checked host (kvaudit.check.HostAudit), named as the caller named it."""
    j = judge_host(h)
    audit = h.audit
    engine = audit.engine if audit is not None else None
    version = audit.engine_version if audit is not None else None
    if h.error is not None:
        return Health(host, engine, version, "unknown", j.headline, (), 0,
                      detail=cause_first(h.error.reason, str(h.error), host))
    findings = list(audit.findings if audit is not None else ()) + list(h.findings)
    ignored = sum(1 for f in findings if f.ignored)
    problems = [_problem(f) for f in counted(findings) if f.severity.rank >= Severity.WARNING.rank]
    # the node's GPUs could not be read (an endpoint or a pod gives no readings by design: not a node problem)
    unreadable = [p for p in h.partial if p.startswith(UNREADABLE)]
    if unreadable:
        problems.append(Problem(NO_GPU_READINGS, Severity.WARNING.value, "node", unreadable[0],
                                ACTIONS[NO_GPU_READINGS]))
    if audit is None and not problems:
        return Health(host, engine, version, "unknown", j.headline, (), ignored)
    if any(p.problem == "node" for p in problems):
        state = "critical"
    elif problems:
        state = "warning"
    else:
        state = "ok"
    # node problems first: the status line names the one that decides the state
    ordered = sorted(problems, key=lambda p: p.problem != "node")
    tokens = audit.formula.logged_tokens if audit is not None else None
    return Health(host, engine, version, state, j.headline, tuple(ordered), ignored, tokens)


# --- the status line (Nagios' first line, NPD's condition message) ------------------------------------------

_STATUS_WORDS = ("OK", "UNCHECKED", "PARTIAL", "WARNING", "ERROR", "FAILED")


def _gib(v: Any) -> str:
    return f"{v:.1f} GiB" if isinstance(v, (int, float)) else "? GiB"


def what(p: Problem) -> str:
    """A problem in a few words, the GPU and the amount first (the finding's message has the whole story)."""
    f = p.fields
    if p.code == "FOREIGN_PROCESS":
        procs = f.get("processes") or []
        pids = ", ".join(str(x.get("pid")) for x in procs[:3]) + (", ..." if len(procs) > 3 else "")
        return f"GPU {f.get('gpu')}: {_gib(f.get('gib'))} held by pid {pids} (not the engine)"
    if p.code == "OCCUPIED_AT_STARTUP":
        return f"GPU {f.get('gpu')}: {_gib(f.get('before_t_gib'))} held before the engine started"
    if p.code == "ORPHANED_ENGINE_PROCESS":
        orphans = list(f.get("pids") or [])
        return (f"{_gib(f.get('gib'))} held by orphaned engine pid {', '.join(map(str, orphans[:3]))}"
                + (", ..." if len(orphans) > 3 else ""))
    if p.code == "IDLE_TENANT_MEMORY":
        return f"GPU {f.get('gpu')}: {_gib(f.get('gib'))} held by {f.get('why')} pid {f.get('pid')}"
    if p.code == "GPU_COUNT_MISMATCH":
        return f"{f.get('mapped')} of {f.get('gpus')} GPUs match the log's {f.get('ranks')} ranks"
    if p.code == NO_GPU_READINGS:
        return f"GPUs unreadable: {p.message}"
    # a quoted engine error's "line 183: " spends the 80 bytes on what `kvaudit check` shows in full
    return f"{p.code}: {re.sub(r'^line [0-9,]+: ', '', p.message)}"


def _cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes: whole clauses ("; ") when they fit, else words, then "..."."""
    if len(text.encode()) <= limit:
        return text
    clauses = text.split("; ")
    for n in range(len(clauses) - 1, 0, -1):
        head = "; ".join(clauses[:n])
        if len(head.encode()) <= limit:
            return head
    room = limit - 3
    cut = text.encode()[:room].decode("utf-8", "ignore")
    if " " in cut[room // 2:]:
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip(" ,;:(") + "..."


def status_text(v: Health, limit: int = STATUS_TEXT_BYTES) -> str:
    """``KVAUDIT <STATE> - <what>`` in at most ``limit`` bytes, one line, no ``|`` (Nagios' perfdata separator)."""
    prefix = f"KVAUDIT {v.state.upper()} - "
    if v.problems:
        more = f" (+{len(v.problems) - 1} more)" if len(v.problems) > 1 else ""
        body = what(v.problems[0])
    elif v.detail is not None:
        more, body = "", v.detail
    else:
        more = ""
        word, _, rest = v.headline.partition(" ")
        body = (rest if word == "OK" else f"{word.lower()}: {rest}") if word in _STATUS_WORDS else v.headline
    body = " ".join(printable(body).replace("|", "/").split())
    room = limit - len(prefix.encode()) - len(more.encode())
    return prefix + _cut(body, room) + more


def perfdata(v: Health, seconds: float | None = None) -> str:
    """Nagios performance data (``label=value[UOM];warn;crit;min;max``): the problem counts with the thresholds
    that decide the state (a node problem is critical, a config problem a warning: Nagios' range ``0`` alerts
    above 0), the KV tokens, and how long the check took against NPD's 5 s."""
    node = sum(p.problem == "node" for p in v.problems)
    config = len(v.problems) - node
    items = [f"node_problems={node};;0;0;", f"config_problems={config};0;;0;", f"ignored={v.ignored};;;0;"]
    if v.kv_tokens is not None:
        items.append(f"kv_tokens={v.kv_tokens};;;0;")
    if seconds is not None:
        items.append(f"time={seconds:.3f}s;;{NPD_TIMEOUT_S:g};0;")
    return " ".join(items)


def render(v: Health, scale: str, seconds: float | None = None) -> str:
    """The verdict as its reader takes it: Nagios plugin output (``nagios``) or NPD's one message (``npd``)."""
    line = status_text(v)
    if scale == "npd":
        return line + "\n"
    out = [f"{line} | {perfdata(v, seconds)}"]
    for p in v.problems:
        out.append(" ".join(printable(f"{p.code} ({p.problem}): {p.message}; do: {p.action}").replace("|", "/")
                            .split()))
    return "\n".join(out) + "\n"
