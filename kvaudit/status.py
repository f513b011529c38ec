"""Process exit statuses: what scripts and cron branch on. Documented in docs/exit-codes.md."""

from __future__ import annotations

from enum import IntEnum

from kvaudit.reconcile.interface import Audit, Severity


class ExitStatus(IntEnum):
    OK = 0  # audited; nothing above info
    WARNINGS = 1  # audited; at least one warning finding
    BAD_INPUT = 2  # unreadable input, or a usage error (same code click uses for usage errors)
    LOG_ERRORS = 3  # audited; the log shows the startup failed or ran out of memory (error findings)
    UNREACHABLE = 4  # check: connection refused, timed out, dropped, or past the host deadline
    AUTH_REFUSED = 5  # check: authentication refused, or the host key unknown (no opt-in) or changed
    PARTIAL_DATA = 6  # check: audited what could be read; something was missing (no GPU readings, no engine log...)
    INTERNAL_ERROR = 70  # a bug in kvaudit (EX_SOFTWARE); the message asks for a report


def for_audits(audits: list[Audit]) -> ExitStatus:
    worst = max((a.worst.rank for a in audits if a.worst is not None), default=0)
    if worst >= Severity.ERROR.rank:
        return ExitStatus.LOG_ERRORS
    if worst >= Severity.WARNING.rank:
        return ExitStatus.WARNINGS
    return ExitStatus.OK


_BY_REASON = {"unreachable": ExitStatus.UNREACHABLE, "timeout": ExitStatus.UNREACHABLE,
           "dropped": ExitStatus.UNREACHABLE, "auth": ExitStatus.AUTH_REFUSED,
           "host_key": ExitStatus.AUTH_REFUSED, "no_engine": ExitStatus.PARTIAL_DATA,
           "refused_command": ExitStatus.INTERNAL_ERROR, "bad_capture": ExitStatus.BAD_INPUT,
           "bad_setting": ExitStatus.BAD_INPUT,
           "not_inference_server": ExitStatus.PARTIAL_DATA, "kubernetes": ExitStatus.BAD_INPUT,
           "not_found": ExitStatus.BAD_INPUT, "forbidden": ExitStatus.AUTH_REFUSED,
           "journal_denied": ExitStatus.AUTH_REFUSED, "ssh_config": ExitStatus.BAD_INPUT,
           "interrupted": ExitStatus.UNREACHABLE, "bad_answer": ExitStatus.UNREACHABLE}


def for_error(reason: str) -> ExitStatus:
    """A host that could not be audited: its CollectError reason -> the exit status."""
    return _BY_REASON.get(reason, ExitStatus.UNREACHABLE)


def for_host(h) -> ExitStatus:
    """A checked host: transport failures first, then what the log says, then missing data, then warnings."""
    if h.error is not None:
        return for_error(h.error.reason)
    findings = [f for f in list(h.audit.findings if h.audit else ()) + list(h.findings) if not f.ignored]
    worst = max((f.severity.rank for f in findings), default=0)
    if worst >= Severity.ERROR.rank:
        return ExitStatus.LOG_ERRORS
    if h.partial:
        return ExitStatus.PARTIAL_DATA
    if worst >= Severity.WARNING.rank:
        return ExitStatus.WARNINGS
    return ExitStatus.OK


#: a fleet's exit status: the first class any host falls in, in this order. The classes stay apart: a bug
#: (70), a host that could not be reached (4), one that refused us (5: auth, host key, RBAC, journal
#: permission), one whose settings are wrong (2), then what the audited hosts show (3, 6, 1)
FLEET_ORDER = (ExitStatus.INTERNAL_ERROR, ExitStatus.UNREACHABLE, ExitStatus.AUTH_REFUSED, ExitStatus.BAD_INPUT,
               ExitStatus.LOG_ERRORS, ExitStatus.PARTIAL_DATA, ExitStatus.WARNINGS)


def for_fleet(hosts) -> ExitStatus:
    """A fleet run: the most pressing class among its hosts (FLEET_ORDER), OK when every host is clean."""
    codes = {for_host(h) for h in hosts}
    return next((c for c in FLEET_ORDER if c in codes), ExitStatus.OK)
