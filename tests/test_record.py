"""kvaudit.record: a frozen dataclass on Record (eq=False, repr=False) compares, hashes and prints as the same
declaration with dataclass's generated methods (issue 40: the methods are written once, not exec'd per class)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from kvaudit.parse.interface import Rank
from kvaudit.parse.sglang import KVAlloc
from kvaudit.record import Record, record


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


# @record: the same class as @dataclass(frozen=True), declared without exec'ing any method at import

@record
class Declared:
    line: int
    text: str = field(repr=False)
    size: float | None = None
    tags: tuple[str, ...] = field(default=(), compare=False)
    note: str = field(default="", hash=False)


@record
class WithFactory:
    items: list[int] = field(default_factory=list)
    derived: int = field(default=0, init=False)
    checked: list[str] = field(default_factory=list, init=False)


@record
class Child(Declared):
    extra: int = 7

    def __post_init__(self) -> None:
        if self.extra < 0:
            raise ValueError("extra must not be negative")


@pytest.mark.parametrize("a", CASES)
@pytest.mark.parametrize("b", CASES)
def test_a_record_compares_hashes_prints_and_freezes_as_a_frozen_dataclass(a, b):
    ga, gb, ra, rb = Generated(*a), Generated(*b), Declared(*a), Declared(*b)
    assert (ra == rb) == (ga == gb) and (ra != rb) == (ga != gb)
    assert hash(ra) == hash(ga)
    assert repr(ra) == repr(ga).replace("Generated", "Declared")
    assert dataclasses.asdict(ra) == dataclasses.asdict(ga) and dataclasses.astuple(ra) == dataclasses.astuple(ga)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ra.line = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del ra.line  # type: ignore[misc]
    assert dataclasses.replace(ra, size=1.0) == Declared(a[0], a[1], 1.0, *a[3:])
    assert Declared(*a) != Child(*a) and Child(*a) != Declared(*a)


def test_a_records_init_takes_what_dataclass_takes_and_is_compiled_on_first_use():
    @record
    class Fresh:
        a: int
        b: str = "x"

    stub = Fresh.__dict__["__init__"]
    assert Fresh(1) == Fresh(a=1, b="x") and Fresh.__dict__["__init__"] is not stub  # compiled, then kept
    assert Fresh.__match_args__ == ("a", "b") and [f.name for f in dataclasses.fields(Fresh)] == ["a", "b"]
    with pytest.raises(TypeError):
        Fresh()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fresh(1, "y", 3)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fresh(1, c=2)  # type: ignore[call-arg]
    one, two = WithFactory(), WithFactory()
    assert one.items == [] and one.items is not two.items and one.checked == [] and one.derived == 0
    with pytest.raises(TypeError):
        WithFactory(derived=1)  # type: ignore[call-arg]
    assert Child(1, "t").extra == 7 and Child(1, "t", extra=3) == Child(1, "t", None, (), "", 3)
    with pytest.raises(ValueError, match="negative"):
        Child(1, "t", extra=-1)  # __post_init__ runs, as dataclass's __init__ calls it


def test_every_frozen_class_of_kvaudit_is_a_record_and_its_events_are_unchanged():
    import importlib
    import pkgutil

    import kvaudit

    frozen_dataclasses = []
    for mod in pkgutil.walk_packages(kvaudit.__path__, "kvaudit."):
        if mod.name.endswith("__main__"):
            continue  # runs the CLI
        try:
            m = importlib.import_module(mod.name)
        except ImportError:  # an optional extra this machine lacks (systemd-python may not build)
            continue
        for obj in vars(m).values():
            params = getattr(obj, "__dataclass_params__", None)
            if isinstance(obj, type) and obj.__module__ == m.__name__ and params is not None and params.frozen:
                frozen_dataclasses.append(obj.__qualname__)
    # the one left is Rank, whose order=True @record does not offer
    assert frozen_dataclasses == ["Rank"]
    ev = KVAlloc(7, "the line", Rank((0, 1, 0), "TP1"), dtype="torch.bfloat16", tokens=1000, k_gib=1.5, v_gib=1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.tokens = 1  # type: ignore[misc]
