"""Frozen value classes that cost little to declare: ``@record`` and :class:`Record`.

``@dataclass(frozen=True)`` compiles six methods per class from source text at import (``__init__``,
``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``); on Python 3.11 each is its own
``exec``, and for the ~75 classes a log's audit loads they were about a third of what ``kvaudit explain`` of a
small log executed (issue 40, bench/README.md). A class declared ``@dataclass(frozen=True, eq=False,
repr=False)`` on top of :class:`Record` has three generated methods and takes the other three from here, with
the dataclass's own semantics: equal when of the same class with equal compared fields, the hash of the
compared fields (``hash=`` of a field honoured), and ``Name(field=value, ...)`` over the fields with
``repr=True``.

``@record`` goes the rest of the way: it declares a dataclass with none of the six generated methods (the
fields, ``fields()``, ``replace()``, ``asdict()`` and ``__match_args__`` as a dataclass has them), takes
``__eq__``, ``__hash__`` and ``__repr__`` from :class:`Record`, ``__setattr__`` and ``__delattr__`` (which
raise ``FrozenInstanceError``) from here, and compiles ``__init__`` the first time the class is instantiated,
not at import: most classes an audit loads are never instantiated in a given run (the other engines' events,
the findings that did not fire). Declaring a class costs ~35 us instead of ~300-470 us; an ``__init__``
compiles as dataclass's does and runs as fast. Type checkers read it as ``@dataclass(frozen=True)``
(PEP 681's ``dataclass_transform``): assigning to a field is still a type error.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, Field, FrozenInstanceError, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
elif sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10: the marker is for type checkers only
    def dataclass_transform(**_: object) -> Callable[[Any], Any]:
        return lambda f: f

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
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # what dataclasses.fields/replace look for

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


_C = TypeVar("_C", bound=type)
#: the sentinel of a parameter whose default comes from a factory
_FACTORY = object()


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _compile_init(cls: type) -> Callable[..., None]:
    """The ``__init__`` dataclass would generate for a frozen ``cls``: each field set with
    ``object.__setattr__``, defaults and factories as declared, then ``__post_init__`` if the class has one."""
    ns: dict[str, Any] = {"__kv_set": object.__setattr__, "__kv_factory": _FACTORY}
    params, body = [], []
    for f in fields(cls):
        name = f.name
        if f.default is not MISSING:
            ns[f"__kv_d_{name}"] = f.default
        if f.default_factory is not MISSING:
            ns[f"__kv_f_{name}"] = f.default_factory
        factory = f.default_factory is not MISSING
        if f.init:
            if factory:
                params.append(f"{name}=__kv_factory")
                value = f"__kv_f_{name}() if {name} is __kv_factory else {name}"
            else:
                params.append(name if f.default is MISSING else f"{name}=__kv_d_{name}")
                value = name
        elif factory:
            value = f"__kv_f_{name}()"
        elif f.default is not MISSING:
            value = f"__kv_d_{name}"
        else:
            continue  # init=False without a default: dataclass leaves it unset too
        body.append(f"    __kv_set(self, {name!r}, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    src = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(src, ns)  # noqa: S102 - the source is built from the class's own field names, as dataclasses does
    init: Callable[..., None] = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _lazy_init(cls: type) -> Callable[..., None]:
    def __init__(self: object, *args: Any, **kwargs: Any) -> None:
        init = _compile_init(cls)
        cls.__init__ = init  # type: ignore[misc]  # later instances call the compiled one directly
        init(self, *args, **kwargs)

    return __init__


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls: _C) -> _C:
    """``@dataclass(frozen=True)`` at a fraction of its import cost (see the module's docstring)."""
    if cls.__doc__ is None:
        cls.__doc__ = cls.__name__  # dataclass would build one with inspect.signature
    dataclass(init=False, repr=False, eq=False)(cls)
    own = cls.__dict__
    for name, method in (("__eq__", Record.__eq__), ("__hash__", Record.__hash__), ("__repr__", Record.__repr__),
                         ("__setattr__", _frozen_setattr), ("__delattr__", _frozen_delattr)):
        if name not in own or (name == "__hash__" and own[name] is None):
            setattr(cls, name, method)
    if "__init__" not in own:
        cls.__init__ = _lazy_init(cls)  # type: ignore[misc]
    return cls
