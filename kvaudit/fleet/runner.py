"""Auditing many hosts: a bounded thread pool (paramiko is thread-based), one deadline per host and one for
the whole run. A host that fails is recorded with its reason; it never stops the others."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable

from kvaudit.check import CheckOptions, check
from kvaudit.collect.interface import BadSetting, CollectError, HostTimeout
from kvaudit.model_config import ConfigError
from kvaudit.results import FleetHost, FleetRun, HostAudit


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
        identity_file=host.vars.get("ansible_ssh_private_key_file") or base.identity_file,
        deadline_s=max(1.0, min(base.deadline_s, run_deadline - time.monotonic())),
    )
    try:
        path = host.setting("model_config")
        if path:  # kvaudit_model_config: this host's config.json, read on the auditing machine
            try:
                opts = replace(opts, audit=replace(opts.audit, model_geometry=_geometry(path)))
            except ConfigError as exc:
                return HostAudit(host.target, None, None, (), (), BadSetting(f"kvaudit_model_config: {exc}"))
        h = check(host.target, opts)
        return replace(h, notes=h.notes + host.notes) if host.notes else h
    except Exception as exc:  # a bug or an unforeseen library error: this host fails, the run goes on
        return HostAudit(host.target, None, None, (), (),
                         InternalHostError(f"{host.name}: {type(exc).__name__}: {exc}"))


def _geometry(path: str):
    """A host's kvaudit_model_config, read once per run and path (many hosts share one model)."""
    from kvaudit.model_config import load_config

    with _GEOMETRY_LOCK:
        if path not in _GEOMETRIES:
            _GEOMETRIES[path] = load_config(path)
        return _GEOMETRIES[path]


_GEOMETRIES: dict[str, object] = {}
_GEOMETRY_LOCK = threading.Lock()


class Interrupted(CollectError):
    reason = "interrupted"  # Ctrl-C before this host finished


def run(hosts: list[FleetHost], base: CheckOptions, parallel: int, run_timeout: float,
        on_done: Callable[[FleetHost, HostAudit], None] | None = None,
        on_start: Callable[[FleetHost], None] | None = None) -> FleetRun:
    """Audit ``hosts``, ``parallel`` at a time. Returns at the run deadline whatever the workers are doing, and
    on Ctrl-C (KeyboardInterrupt in the main thread): hosts not started are cancelled, open SSH sessions are
    closed (their workers return at once), and the hosts not finished are recorded as ``interrupted``.

    The workers are daemon threads: one stuck inside the SSH library past the deadline cannot keep the process
    alive (a ThreadPoolExecutor's threads are joined at interpreter exit: a cron job would hang)."""
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    deadline = t0 + run_timeout
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(hosts)):
        todo.put(i)
    done: queue.Queue[tuple[int, HostAudit]] = queue.Queue()
    cancel = threading.Event()

    def worker() -> None:
        while not cancel.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            if on_start:
                on_start(hosts[i])
            done.put((i, _one(hosts[i], base, deadline)))

    for n in range(min(max(1, parallel), len(hosts))):
        threading.Thread(target=worker, name=f"kvaudit-host-{n}", daemon=True).start()
    results: dict[int, HostAudit] = {}
    hit = False
    stop = threading.Event()  # Ctrl-C: set by the handler, seen by the loop (no exception mid-bookkeeping)
    previous = _on_interrupt(stop.set)
    try:
        while len(results) < len(hosts) and not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                hit = True
                break
            try:
                i, h = done.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            results[i] = h
            if on_done:
                on_done(hosts[i], h)
    except KeyboardInterrupt:  # no handler could be installed (not the main thread): the default behaviour
        stop.set()
    finally:
        _restore_interrupt(previous)
    interrupted = stop.is_set()
    if interrupted:
        cancel.set()
        close_all_sessions()
    cancel.set()
    while True:  # what finished while we stopped
        try:
            i, h = done.get_nowait()
        except queue.Empty:
            break
        results.setdefault(i, h)
    for i, host in enumerate(hosts):
        if i in results:
            continue
        if interrupted:
            results[i] = HostAudit(host.target, None, None, (), (), Interrupted(f"{host.name}: interrupted (Ctrl-C)"))
        else:
            results[i] = HostAudit(host.target, None, None, (), (),
                                   HostTimeout(f"{host.name}: not finished within the {run_timeout:g} s run deadline"))
        if on_done and not interrupted:
            on_done(host, results[i])
    return FleetRun(started.isoformat(timespec="seconds"), started.timestamp(), round(time.monotonic() - t0, 3),
                    parallel, tuple((h, results[i]) for i, h in enumerate(hosts)), hit, interrupted)


def _on_interrupt(callback: Callable[[], None]):
    """SIGINT calls ``callback`` for the duration of the run (main thread only; elsewhere nothing changes)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGINT, lambda signum, frame: callback())
    except ValueError:
        return None


def _restore_interrupt(previous) -> None:  # noqa: ANN001
    import signal

    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def close_all_sessions() -> None:
    """Close every SSH connection kvaudit has open (Ctrl-C): a worker blocked on one returns at once."""
    import sys

    ssh = sys.modules.get("kvaudit.collect.ssh")
    if ssh is not None:
        ssh.close_all()
