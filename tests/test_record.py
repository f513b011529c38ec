"""kvaudit.record: a frozen dataclass on Record (eq=False, repr=False) compares, hashes and prints as the same
declaration with dataclass's generated methods (issue 40: the methods are written once, not exec'd per class)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from kvaudit.parse.interface import Rank
from kvaudit.parse.sglang import KVAlloc
from kvaudit.record import Record


@dataclass(frozen=True)
class Generated:
    line: int
    text: str = field(repr=False)
    size: float | None = None
    tags: tuple[str, ...] = field(default=(), compare=False)
    note: str = field(default="", hash=False)


@dataclass(frozen=True, eq=False, repr=False)
class Written(Record):
    line: int
    text: str = field(repr=False)
    size: float | None = None
    tags: tuple[str, ...] = field(default=(), compare=False)
    note: str = field(default="", hash=False)


@dataclass(frozen=True, eq=False, repr=False)
class Other(Record):
    line: int
    text: str = field(repr=False)
    size: float | None = None
    tags: tuple[str, ...] = field(default=(), compare=False)
    note: str = field(default="", hash=False)


CASES = [(1, "a"), (1, "b", 2.5), (2, "a", None, ("x",)), (1, "a", None, ("y",), "n"), (1, "a", float("nan"))]


@pytest.mark.parametrize("a", CASES)
@pytest.mark.parametrize("b", CASES)
def test_equality_hash_and_repr_as_dataclass_generates_them(a, b):
    ga, gb, wa, wb = Generated(*a), Generated(*b), Written(*a), Written(*b)
    assert (wa == wb) == (ga == gb) and (wa != wb) == (ga != gb)
    assert hash(wa) == hash(ga)
    assert repr(wa) == repr(ga).replace("Generated", "Written")
    assert wa != Other(*a) and Other(*a) != wa  # another class is never equal, as with dataclass
    with pytest.raises(dataclasses.FrozenInstanceError):
        wa.line = 3  # type: ignore[misc]
    assert dataclasses.replace(wa, size=1.0) == Written(a[0], a[1], 1.0, *a[3:])


def test_an_event_prints_and_compares_as_before():
    ev = KVAlloc(7, "the line", Rank((0, 1, 0), "TP1"), dtype="torch.bfloat16", tokens=1000, k_gib=1.5, v_gib=1.5)
    assert repr(ev) == ("KVAlloc(line=7, rank=Rank(sort_key=(0, 1, 0), label='TP1'), role='target', label='', "
                        "dtype='torch.bfloat16', tokens=1000, tokens_approx=False, k_gib=1.5, v_gib=1.5, kv_gib=None, "
                        "upper_bound=False)")
    assert "the line" not in repr(ev)  # text is repr=False
    assert ev == dataclasses.replace(ev) and hash(ev) == hash(dataclasses.replace(ev))
    assert ev != dataclasses.replace(ev, line=8)
