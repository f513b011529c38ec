"""Running the same read-only commands on this machine (``kvaudit check local``), and reading the local
journal through systemd-python when it is installed (the ``kvaudit[journal]`` extra)."""

from __future__ import annotations

import subprocess
import time
from typing import Iterator

from kvaudit.collect.interface import CommandResult


class LocalRunner:
    def run(self, command: str, timeout: float, max_bytes: int) -> CommandResult:
        start = time.monotonic()
        try:
            p = subprocess.run(["sh", "-c", command], capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return CommandResult(command, None, (exc.stdout or b"")[:max_bytes],
                                 (exc.stderr or b"") + b"\n[kvaudit: timed out]", time.monotonic() - start)
        out = p.stdout
        truncated = len(out) > max_bytes
        return CommandResult(command, p.returncode, out[:max_bytes], p.stderr, time.monotonic() - start, truncated)

    def run_batch(self, commands: list[str], timeout: float, max_bytes: int) -> list[CommandResult]:
        return [self.run(c, timeout, max_bytes) for c in commands]

    def close(self) -> None:
        pass


def journal_python(unit: str | None, invocation: str | None, directory: str | None,
                   anchors: tuple[bytes, ...]) -> Iterator[tuple[int, str]] | None:
    """The journal through systemd-python, filtered with the same anchors; None when the module is absent.
    Line numbers count the unit's messages in order, like ``journalctl -o cat | grep -n``."""
    try:
        from systemd import journal  # type: ignore[import-not-found]
    except ImportError:
        return None
    reader = journal.Reader(path=directory) if directory else journal.Reader()
    if invocation:
        reader.add_match(_SYSTEMD_INVOCATION_ID=invocation)
    elif unit:
        reader.add_match(_SYSTEMD_UNIT=unit)
    texts = tuple(a.decode("latin-1") for a in anchors)

    def gen() -> Iterator[tuple[int, str]]:
        n = 0
        for entry in reader:
            msg = entry.get("MESSAGE", "")
            if isinstance(msg, bytes):
                msg = msg.decode("utf-8", "replace")
            for piece in str(msg).split("\n"):
                n += 1
                if any(t in piece for t in texts):
                    yield n, piece[: 1 << 20]

    return gen()
