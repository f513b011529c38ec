"""Units and rounding.

SGLang prints every device-memory figure as ``f"{x / (1 << 30):.2f} GB"``: the label says GB, the value is
GiB (2**30 bytes), rounded to two decimals. A printed 10.42 therefore stands for any true value in
[10.415, 10.425). :class:`Interval` carries that uncertainty through the arithmetic so that a prediction
made from logged values is an interval, never a falsely precise number. HiCache host memory is the one
SGLang figure in decimal GB (10**9 bytes).
"""

from __future__ import annotations

from kvaudit.record import record


GIB = 1 << 30
MIB = 1 << 20
GB_DECIMAL = 10**9

#: half of the last printed digit of a ``:.2f`` value
LOG_HALF_ULP = 0.005


@record
class Interval:
    """A closed interval [lo, hi] of real values (GiB, tokens, ...)."""

    lo: float
    hi: float

    @staticmethod
    def logged(value: float, half_ulp: float = LOG_HALF_ULP) -> "Interval":
        return Interval(value - half_ulp, value + half_ulp)

    @staticmethod
    def exact(value: float) -> "Interval":
        return Interval(value, value)

    @property
    def mid(self) -> float:
        return (self.lo + self.hi) / 2

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def __add__(self, other: "Interval | float") -> "Interval":
        o = _as_interval(other)
        return Interval(self.lo + o.lo, self.hi + o.hi)

    def __sub__(self, other: "Interval | float") -> "Interval":
        o = _as_interval(other)
        return Interval(self.lo - o.hi, self.hi - o.lo)

    def scale(self, k: float) -> "Interval":
        a, b = self.lo * k, self.hi * k
        return Interval(min(a, b), max(a, b))

    def contains(self, x: float, slack: float = 0.0) -> bool:
        return self.lo - slack <= x <= self.hi + slack


def _as_interval(x: "Interval | float") -> Interval:
    return x if isinstance(x, Interval) else Interval(x, x)


def gib(nbytes: float) -> float:
    return nbytes / GIB
