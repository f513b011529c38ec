"""Process exit statuses: what scripts and cron branch on. Documented in docs/exit-codes.md."""

from __future__ import annotations

from enum import IntEnum

from kvaudit.reconcile.interface import Audit, Severity


class ExitStatus(IntEnum):
    OK = 0  # audited; nothing above info
    WARNINGS = 1  # audited; at least one warning finding
    BAD_INPUT = 2  # unreadable input, or a usage error (same code click uses for usage errors)
    LOG_ERRORS = 3  # audited; the log shows the startup failed or ran out of memory (error findings)
    INTERNAL_ERROR = 70  # a bug in kvaudit (EX_SOFTWARE); the message asks for a report


def for_audits(audits: list[Audit]) -> ExitStatus:
    worst = max((a.worst.rank for a in audits if a.worst is not None), default=0)
    if worst >= Severity.ERROR.rank:
        return ExitStatus.LOG_ERRORS
    if worst >= Severity.WARNING.rank:
        return ExitStatus.WARNINGS
    return ExitStatus.OK
