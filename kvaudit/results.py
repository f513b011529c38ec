"""What a check or a fleet run produced, as data: a checked host, a fleet run, a change since the last run.

These types sit below every layer that uses them (the verdict judges them, the reports render them, the
commands produce them), so no renderer imports a command module to name what it renders. Nothing here
decides anything: the status of a host is :func:`kvaudit.verdict.judge_host`'s.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from kvaudit.collect.interface import CollectError, Collected
from kvaudit.reconcile.interface import Audit, Finding
from kvaudit.reconcile.live import GpuLedger
from kvaudit.record import record


@record
class FleetHost:
    """One host of an inventory."""

    name: str  # how reports name it
    target: str  # what SSH connects to: user@host:port, or an ssh_config alias
    groups: tuple[str, ...] = ()
    vars: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what the inventory asked that kvaudit does not do (become), said in the report

    def setting(self, key: str) -> str | None:
        v = self.vars.get(f"kvaudit_{key}")
        return str(v) if v is not None else None


@record
class HostAudit:
    """A checked host: what was collected, the audit of its startup, its GPUs now, and its live findings."""

    target: str
    collected: Collected | None
    audit: Audit | None
    gpus: tuple[GpuLedger, ...]
    findings: tuple[Finding, ...]  # live findings (the audit's own are in audit.findings)
    error: CollectError | None = None
    notes: tuple[str, ...] = ()

    @property
    def partial(self) -> tuple[str, ...]:
        return self.collected.partial if self.collected else ()

    @property
    def all_findings(self) -> tuple[Finding, ...]:
        """The audit's findings, then the live ones."""
        return tuple(self.audit.findings if self.audit else ()) + tuple(self.findings)


@record
class FleetRun:
    started_at: str  # ISO 8601 UTC
    started_ts: float  # seconds since the epoch
    duration_s: float
    parallel: int
    results: tuple[tuple[FleetHost, HostAudit], ...]  # in inventory order
    deadline_hit: bool
    interrupted: bool = False  # Ctrl-C: the hosts not finished are marked "interrupted"

    @property
    def failed(self) -> list[tuple[FleetHost, HostAudit]]:
        return [(f, h) for f, h in self.results if h.error is not None]


@record
class Drift:
    """A change of one host (or one of its GPUs) since the last run in the history."""

    host: str
    gpu: int | None
    what: str  # tokens | free | weights | finding_new | finding_resolved | status | restart | failing | history
    before: Any
    after: Any
    message: str
