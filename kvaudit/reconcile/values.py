"""Settings as the engines' argument dumps give them: any JSON/Python value, read as a number or not at all."""

from __future__ import annotations

import math
from typing import Any


def as_int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def as_float(v: Any) -> float | None:
    """A finite float, or None (an ``inf`` or ``nan`` in a dump is not a setting)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None
