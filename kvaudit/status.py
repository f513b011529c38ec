"""The vocabulary of a judgement: the one :class:`Status` every output shows, in one order, and the process
exit statuses scripts and cron branch on (docs/exit-codes.md). Data only: which status a host or an audit
has is decided in one place, :mod:`kvaudit.verdict`; every report, the history, the Prometheus textfile
and the health check read it from the :class:`kvaudit.verdict.Judgement` they are handed.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class ExitStatus(IntEnum):
    OK = 0  # audited; nothing above info (the status ok or unchecked)
    WARNINGS = 1  # audited; at least one warning finding
    BAD_INPUT = 2  # unreadable input, or a usage error (same code click uses for usage errors)
    LOG_ERRORS = 3  # audited; the log shows the startup failed or ran out of memory (error findings)
    UNREACHABLE = 4  # check: connection refused, timed out, dropped, or past the host deadline
    AUTH_REFUSED = 5  # check: authentication refused, or the host key unknown (no opt-in) or changed
    PARTIAL_DATA = 6  # check: audited what could be read; something was missing (no GPU readings, no engine log...)
    INTERNAL_ERROR = 70  # a bug in kvaudit (EX_SOFTWARE); the message asks for a report
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it


class Status(str, Enum):
    """What kvaudit concluded about an audit, a host or a fleet, from the worst to the best (the declaration
    order is the order every report sorts and counts by).

    - ``failed``: the host could not be audited (its reason says why: unreachable, auth, ...);
    - ``error``: the log shows the startup failed or ran out of memory;
    - ``warning``: a finding a person should act on;
    - ``partial``: audited, but something was missing (no GPU readings, no config, no engine log);
    - ``unchecked``: read, but nothing kvaudit models could be checked (said why in the headline);
    - ``ok``: a check ran and held, and nothing above info was found.
    """

    FAILED = "failed"
    ERROR = "error"
    WARNING = "warning"
    PARTIAL = "partial"
    UNCHECKED = "unchecked"
    OK = "ok"

    @property
    def rank(self) -> int:
        """0 for the worst (failed) ... 5 for ok."""
        return ORDER.index(self)

    @classmethod
    def of(cls, label: str | None) -> "Status | None":
        """The status of a label as the reports write it (``failed:unreachable`` is ``failed``); None for
        anything else (an old history row, a hand-edited file)."""
        if not isinstance(label, str):
            return None
        try:
            return cls(label.split(":", 1)[0])
        except ValueError:
            return None


#: every status from the worst to the best
ORDER: tuple[Status, ...] = tuple(Status)


def label_rank(label: str | None) -> int:
    """Where a status label sorts (``failed:unreachable`` as ``failed``), the worst first; unknown labels last."""
    s = Status.of(label)
    return s.rank if s is not None else len(ORDER)


#: the reason of a host a Ctrl-C left unfinished (kvaudit.fleet.runner): its status is ``failed:interrupted``
#: (JSON, CSV, history, exit status), but it says nothing of the host, so a fleet's counts and tables give it
#: apart and last, as ``interrupted``
INTERRUPTED = "interrupted"


def tally(label: str | None, reason: str | None = None) -> str:
    """The word a host is counted under in a fleet's summary (``2 failed, 1 warning, 17 ok, 3 interrupted``):
    its status (``failed:auth`` is ``failed``), or ``interrupted`` for a host a Ctrl-C left unfinished."""
    if reason == INTERRUPTED or label == f"{Status.FAILED.value}:{INTERRUPTED}":
        return INTERRUPTED
    return str(label or "").split(":", 1)[0]


def tally_rank(word: str) -> tuple[bool, int]:
    """Where a tally word sorts: the statuses worst first, ``interrupted`` after all of them."""
    return (word == INTERRUPTED, label_rank(word))


#: a host that could not be audited: its CollectError reason -> the exit status
_BY_REASON = {"unreachable": ExitStatus.UNREACHABLE, "timeout": ExitStatus.UNREACHABLE,
              "dropped": ExitStatus.UNREACHABLE, "auth": ExitStatus.AUTH_REFUSED,
              "host_key": ExitStatus.AUTH_REFUSED, "no_engine": ExitStatus.PARTIAL_DATA,
              "refused_command": ExitStatus.INTERNAL_ERROR, "internal": ExitStatus.INTERNAL_ERROR,
              "bad_capture": ExitStatus.BAD_INPUT, "bad_setting": ExitStatus.BAD_INPUT,
              "not_inference_server": ExitStatus.PARTIAL_DATA, "kubernetes": ExitStatus.BAD_INPUT,
              "not_found": ExitStatus.BAD_INPUT, "forbidden": ExitStatus.AUTH_REFUSED,
              "journal_denied": ExitStatus.AUTH_REFUSED, "ssh_config": ExitStatus.BAD_INPUT,
              "interrupted": ExitStatus.UNREACHABLE, "bad_answer": ExitStatus.UNREACHABLE}

#: the exit status of each audited status (``failed`` takes its reason's, above)
_BY_STATUS = {Status.ERROR: ExitStatus.LOG_ERRORS, Status.WARNING: ExitStatus.WARNINGS,
              Status.PARTIAL: ExitStatus.PARTIAL_DATA, Status.UNCHECKED: ExitStatus.OK, Status.OK: ExitStatus.OK}


def exit_status(status: Status, reason: str | None = None) -> ExitStatus:
    """The one exit status of a status (and, for ``failed``, of its reason)."""
    if status is Status.FAILED:
        return _BY_REASON.get(reason or "", ExitStatus.UNREACHABLE)
    return _BY_STATUS[status]


def for_error(reason: str) -> ExitStatus:
    """A host that could not be audited: its CollectError reason -> the exit status."""
    return exit_status(Status.FAILED, reason)


#: a fleet's exit status: the first class any host falls in, in this order. The classes stay apart: a bug
#: (70), a host that could not be reached (4), one that refused us (5: auth, host key, RBAC, journal
#: permission), one whose settings are wrong (2), then what the audited hosts show, in the statuses' own order
#: (3 error, 1 warning, 6 partial)
FLEET_ORDER = (ExitStatus.INTERNAL_ERROR, ExitStatus.UNREACHABLE, ExitStatus.AUTH_REFUSED, ExitStatus.BAD_INPUT,
               ExitStatus.LOG_ERRORS, ExitStatus.WARNINGS, ExitStatus.PARTIAL_DATA)
