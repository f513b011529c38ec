"""Auditing many hosts: a bounded thread pool (paramiko is thread-based), one deadline per host and one for
the whole run. A host that fails is recorded with its reason; it never stops the others."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

from kvaudit.check import CheckOptions, HostAudit, check
from kvaudit.collect.interface import CollectError, HostTimeout
from kvaudit.fleet.inventory import FleetHost


@dataclass(frozen=True)
class FleetRun:
    started_at: str  # ISO 8601 UTC
    started_ts: float  # seconds since the epoch
    duration_s: float
    parallel: int
    results: tuple[tuple[FleetHost, HostAudit], ...]  # in inventory order
    deadline_hit: bool

    @property
    def failed(self) -> list[tuple[FleetHost, HostAudit]]:
        return [(f, h) for f, h in self.results if h.error is not None]


class InternalHostError(CollectError):
    reason = "error"


def _one(host: FleetHost, base: CheckOptions, run_deadline: float) -> HostAudit:
    opts = replace(
        base,
        unit=host.setting("unit") or base.unit,
        source=host.setting("source") or base.source,
        journal_directory=host.setting("journal_directory") or base.journal_directory,
        selector=host.setting("selector") or base.selector,
        kubeconfig=host.setting("kubeconfig") or base.kubeconfig,
        deadline_s=max(1.0, min(base.deadline_s, run_deadline - time.monotonic())),
    )
    try:
        return check(host.target, opts)
    except Exception as exc:  # a bug or an unforeseen library error: this host fails, the run goes on
        return HostAudit(host.target, None, None, (), (), InternalHostError(f"{host.name}: {type(exc).__name__}: {exc}"))


def run(hosts: list[FleetHost], base: CheckOptions, parallel: int, run_timeout: float,
        on_done: Callable[[FleetHost, HostAudit], None] | None = None) -> FleetRun:
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    deadline = t0 + run_timeout
    results: dict[int, HostAudit] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="kvaudit-host")
    futures = {pool.submit(_one, h, base, deadline): i for i, h in enumerate(hosts)}
    pending = set(futures)
    hit = False
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            hit = True
            break
        done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
        for f in done:
            i = futures[f]
            results[i] = f.result()
            if on_done:
                on_done(hosts[i], results[i])
    for f in pending:  # past the run deadline: recorded, not waited for (their own deadlines end them)
        f.cancel()
        i = futures[f]
        results[i] = HostAudit(hosts[i].target, None, None, (), (),
                               HostTimeout(f"{hosts[i].name}: not finished within the {run_timeout:g} s run deadline"))
        if on_done:
            on_done(hosts[i], results[i])
    pool.shutdown(wait=False, cancel_futures=True)
    return FleetRun(started.isoformat(timespec="seconds"), started.timestamp(), round(time.monotonic() - t0, 3),
                    parallel, tuple((h, results[i]) for i, h in enumerate(hosts)), hit)
