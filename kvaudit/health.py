"""The health-check contract (``kvaudit check TARGET --health-check``): one JSON verdict and an exit status a
scheduler's node health checker understands (Slurm's HealthCheckProgram / NHC, Kubernetes Node Problem
Detector's custom plugins, Nagios-style monitors). Documented in docs/json.md and docs/fleet.md.

The rule that makes it safe to drain on: only a **node** problem may be critical. A node problem is one the node
itself has, whatever the engine's settings: memory on its GPUs held by another process, memory occupied before
the engine started, GPUs missing or unreadable. Everything about the engine's own settings (a pool that does not
follow the formula, idle memory, a failed startup's configuration) is a **config** problem: it warns, and it
never drains a node. A host that could not be audited is **unknown**.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvaudit.collect.interface import SMI_FAILED, SMI_MISSING
from kvaudit.reconcile.interface import Finding, Severity
from kvaudit.verdict import counted, judge_host

SCHEMA = "kvaudit.health/1"
#: a health check answers within this many seconds unless --timeout says otherwise (schedulers run it often
#: and bound it themselves: NHC's default timeout is 30 s, NPD's plugin timeout 5-60 s)
HEALTH_DEADLINE_S = 10.0

#: findings about the node itself (kvaudit.reconcile.live): the GPUs and what else runs on them
NODE_CODES = ("FOREIGN_PROCESS", "OCCUPIED_AT_STARTUP", "GPU_COUNT_MISMATCH", "UNATTRIBUTED_GPU_MEMORY")
#: a pseudo-code for GPUs that could not be read (nvidia-smi missing or failing, no readings in a pod)
NO_GPU_READINGS = "GPU_READINGS_MISSING"

#: what the collector says when a host's GPUs could not be read
UNREADABLE = (SMI_MISSING, SMI_FAILED)

#: what to do, per finding, in one sentence (the finding's own message says what was seen)
ACTIONS = {
    "FOREIGN_PROCESS": "stop or move the other process on the GPU (nvidia-smi lists it), then restart the engine",
    "OCCUPIED_AT_STARTUP": "free the GPU memory that was held before the engine started (a stale process, "
                           "another tenant), then restart the engine",
    "GPU_COUNT_MISMATCH": "check that every GPU is visible and healthy (nvidia-smi -L, CUDA_VISIBLE_DEVICES, "
                          "the driver's log)",
    "UNATTRIBUTED_GPU_MEMORY": "find what holds the GPU memory no process accounts for (nvidia-smi, the driver)",
    NO_GPU_READINGS: "check the NVIDIA driver and nvidia-smi on the node",
    "STARTUP_FAILED": "read the quoted error (kvaudit check shows its line) and restart after fixing its cause",
    "NOT_ENOUGH_MEMORY": "lower the engine's memory fraction or context length, or free GPU memory, and restart",
    "TOKENS_MISMATCH": "compare the engine's settings with the log's (kvaudit check shows the formula)",
    "UNUSED_MEMORY": "raise the engine's memory fraction to use the idle memory (kvaudit whatif sizes it)",
    "LOW_HEADROOM": "lower the engine's memory fraction: little is left for activations",
}
CONFIG_ACTION = "review the engine's settings (kvaudit check TARGET shows the finding in full)"

#: exit statuses per scale: (ok, config warning, node problem, unknown)
SCALES = {"nagios": (0, 1, 2, 3), "npd": (0, 0, 1, 2)}


@dataclass(frozen=True)
class Problem:
    code: str
    severity: str
    problem: str  # node | config
    message: str
    action: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "severity": self.severity, "problem": self.problem, "message": self.message,
                "action": self.action}


@dataclass(frozen=True)
class Health:
    """The verdict. ``state``: ok | warning (config problems only) | critical (a node problem) | unknown."""

    host: str
    engine: str | None
    engine_version: str | None
    state: str
    headline: str
    problems: tuple[Problem, ...]
    ignored: int

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
    return Problem(f.code, f.severity.value, kind, f.message, ACTIONS.get(f.code, CONFIG_ACTION))


def assess(host: str, h: Any) -> Health:
    """The health of one checked host (kvaudit.check.HostAudit), named as the caller named it."""
    j = judge_host(h)
    audit = h.audit
    engine = audit.engine if audit is not None else None
    version = audit.engine_version if audit is not None else None
    if h.error is not None:
        return Health(host, engine, version, "unknown", j.headline, (), 0)
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
    return Health(host, engine, version, state, j.headline, tuple(problems), ignored)
