"""Running the same read-only commands on this machine (``kvaudit check local``), and reading the local
journal through systemd-python when it is installed (the ``kvaudit[journal]`` extra)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from typing import Iterator

from kvaudit.collect.interface import CommandResult


class LocalRunner:
    def run(self, command: str, timeout: float, max_bytes: int) -> CommandResult:
        """Run one command in its own process group; read stdout up to ``max_bytes`` and the head of stderr as
        they come (a flooding command never grows our memory); on the timeout or the size limit the whole
        group is killed, so no stage of a pipeline outlives it."""
        from kvaudit.collect.ssh import STDERR_KEEP

        start = time.monotonic()
        p = subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        out, err = bytearray(), bytearray()
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ, "out")  # type: ignore[arg-type]
        sel.register(p.stderr, selectors.EVENT_READ, "err")  # type: ignore[arg-type]
        truncated = timed_out = False
        try:
            while sel.get_map():
                left = timeout - (time.monotonic() - start)
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(min(left, 1.0)):
                    chunk = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data == "out":
                        out += chunk
                        if len(out) > max_bytes:
                            del out[max_bytes:]
                            truncated = True
                    elif len(err) < STDERR_KEEP:
                        err += chunk[:STDERR_KEEP - len(err)]
                if truncated:
                    break
        finally:
            sel.close()
            if timed_out or truncated:
                _kill_group(p)
            rc = p.wait()
            p.stdout.close()  # type: ignore[union-attr]
            p.stderr.close()  # type: ignore[union-attr]
        if timed_out:
            return CommandResult(command, None, bytes(out), bytes(err) + b"\n[kvaudit: timed out]",
                                 time.monotonic() - start)
        # cut at the size limit: what arrived is good (the caller says it was cut); the kill's status is ours
        return CommandResult(command, 0 if truncated else rc, bytes(out), bytes(err), time.monotonic() - start,
                             truncated)

    def run_batch(self, commands: list[str], timeout: float, max_bytes: int) -> list[CommandResult]:
        return [self.run(c, timeout, max_bytes) for c in commands]

    def close(self) -> None:
        pass


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def journal_python(unit: str | None, invocation: str | None, directory: str | None,
                   anchors: tuple[bytes, ...]) -> Iterator[tuple[int, str]] | None:
    """The journal through systemd-python, filtered with the same anchors; None when the module is absent.
    Line numbers count the unit's messages in order, like ``journalctl -o cat | grep -n``."""
    try:
        from systemd import journal  # type: ignore[import-not-found,import-untyped,unused-ignore]
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
