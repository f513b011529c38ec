"""The host's deadline over one blocking call that has no timeout of its own.

A socket timeout bounds one read: a server that drips a byte at a time passes every read and would hold the
host forever, and paramiko waits for the answer to an exec request without any timeout. A watchdog calls
``expire`` (close the socket, the transport, the stream) when the deadline passes, which ends the blocked call
in the reading thread; ``fired`` tells the caller that the error it caught was the deadline's doing."""

from __future__ import annotations

import threading
from typing import Callable


class Watchdog:
    def __init__(self, seconds: float, expire: Callable[[], None]) -> None:
        self._expire = expire
        self._fired = threading.Event()
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def _fire(self) -> None:
        self._fired.set()
        self._expire()

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
