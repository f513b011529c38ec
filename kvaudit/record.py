"""Value equality, hashing and repr for frozen dataclasses, written once instead of generated for each class.

``@dataclass(frozen=True)`` compiles six methods per class from source text at import (``__init__``,
``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``); on Python 3.11 each is its own
``exec``, and for the ~75 classes a log's audit loads they were about a third of what ``kvaudit explain`` of a
small log executed (issue 40, bench/README.md). A class declared ``@dataclass(frozen=True, eq=False,
repr=False)`` on top of :class:`Record` has three generated methods and takes the other three from here, with
the dataclass's own semantics: equal when of the same class with equal compared fields, the hash of the
compared fields (``hash=`` of a field honoured), and ``Name(field=value, ...)`` over the fields with
``repr=True``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

_Getter = Callable[[Any], tuple]
#: per class: (the compared fields' values, the hashed fields' values, the repr'd fields' names)
_SHAPES: dict[type, tuple[_Getter, _Getter, tuple[str, ...]]] = {}


def _values(names: tuple[str, ...]) -> _Getter:
    return lambda obj: tuple([getattr(obj, n) for n in names])


def _shape(cls: type) -> tuple[_Getter, _Getter, tuple[str, ...]]:
    shape = _SHAPES.get(cls)
    if shape is None:
        fs = fields(cls)
        compared = tuple(f.name for f in fs if f.compare)
        hashed = tuple(f.name for f in fs if (f.compare if f.hash is None else f.hash))
        shape = _SHAPES[cls] = (_values(compared), _values(hashed), tuple(f.name for f in fs if f.repr))
    return shape


class Record:
    """Base of a frozen dataclass declared with ``eq=False, repr=False``: see the module's docstring."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        compared = _shape(self.__class__)[0]
        return compared(self) == compared(other)

    def __hash__(self) -> int:
        return hash(_shape(self.__class__)[1](self))

    def __repr__(self) -> str:
        names = _shape(self.__class__)[2]
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"
