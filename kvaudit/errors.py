"""One base class for every failure kvaudit explains in one sentence.

A module raises a :class:`KvauditError` (or its own subclass) with the message an operator reads; the CLI prints
it and exits with the error's ``status`` (the codes of :class:`kvaudit.status.ExitStatus`). No call site
translates one error into another to choose a message or an exit code.
"""

from __future__ import annotations


class KvauditError(Exception):
    #: the exit status this failure means: 2 (BAD_INPUT: an input, a file or a setting) unless it says otherwise
    status: int = 2

    def __init__(self, message: str = "", status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = int(status)
