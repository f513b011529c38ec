"""nvidia-smi ``--format=csv,noheader,nounits`` output -> readings. Values are separated by ", "; special
values such as ``[N/A]`` or ``[Requested functionality has been deprecated]`` become None."""

from __future__ import annotations

import math

from kvaudit.collect.interface import ComputeApp, GpuReading
from kvaudit.textsafe import printable


class SmiParseError(ValueError):
    pass


def _num(s: str) -> float | None:
    s = s.strip()
    if not s or s.startswith("["):
        return None
    try:
        v = float(s.replace(" MiB", ""))
    except ValueError:
        return None
    if not math.isfinite(v) or abs(v) > 1e15:  # no GPU has 10**15 MiB: a hostile or broken nvidia-smi
        raise SmiParseError(f"nvidia-smi printed {s[:40]!r}, which is not a reading")
    return v


def _text(s: str, limit: int = 200) -> str:
    """A text field as data: no control or invisible characters (an ESC in a UUID reached 72 lines of a .prom
    textfile), bounded."""
    return printable(s)[:limit]


def parse_gpus(text: str) -> list[GpuReading]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) < 8:
            raise SmiParseError(f"nvidia-smi GPU line {n} has {len(cells)} fields, expected 9: {line[:120]!r}")
        idx = _num(cells[0])
        if idx is None:
            raise SmiParseError(f"nvidia-smi GPU line {n}: index {cells[0]!r} is not a number")
        out.append(GpuReading(int(idx), _text(cells[1]), _text(cells[2]), _text(cells[3]), _num(cells[4]),
                              _num(cells[5]), _num(cells[6]), _num(cells[7]),
                              _text(cells[8]) if len(cells) > 8 else None))
    return out


def parse_apps(text: str) -> list[ComputeApp]:
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) < 4:
            continue
        pid = _num(cells[0])
        if pid is None:
            continue
        out.append(ComputeApp(int(pid), _text(cells[1]), _text(", ".join(cells[2:-1]), 1000), _num(cells[-1])))
    return out
