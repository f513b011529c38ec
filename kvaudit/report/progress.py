"""The fleet's progress on stderr, with rich (typer already brings it): hosts done of total, a bar, the hosts
in flight by name, failures so far, the time left. Shown only when stderr is a terminal (never under cron,
never on stdout), and cleared before the report is printed."""

from __future__ import annotations

import threading
from typing import IO


class FleetProgress:
    def __init__(self, total: int, stream: IO[str]):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._lock = threading.Lock()
        self._flight: list[str] = []
        self._failed = 0
        console = Console(file=stream, force_terminal=True, soft_wrap=False)
        self._progress = Progress(TextColumn("kvaudit fleet"), BarColumn(bar_width=20), MofNCompleteColumn(),
                                  TextColumn("{task.fields[failed]}"), TimeRemainingColumn(),
                                  TextColumn("{task.fields[flight]}"), console=console, transient=True,
                                  refresh_per_second=4)
        self._task = self._progress.add_task("fleet", total=total, failed="", flight="")

    def __enter__(self) -> "FleetProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()  # transient: the line is gone before the report

    def _update(self, advance: int = 0) -> None:
        names = self._flight[:3] + ([f"+{len(self._flight) - 3}"] if len(self._flight) > 3 else [])
        self._progress.update(self._task, advance=advance,
                              failed=f"{self._failed} failed" if self._failed else "",
                              flight=_cut(("in flight: " + ", ".join(names)) if names else "", 60))

    def started(self, host) -> None:  # noqa: ANN001
        with self._lock:
            self._flight.append(host.name)
            self._update()

    def finished(self, host, audit) -> None:  # noqa: ANN001
        with self._lock:
            if host.name in self._flight:
                self._flight.remove(host.name)
            if audit.error is not None:
                self._failed += 1
            self._update(advance=1)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
