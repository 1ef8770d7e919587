"""``record``: a dataclass whose methods are shared closures, not code generated at import.

Python 3.11's ``dataclasses.dataclass`` writes each method it adds (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, a frozen class's ``__setattr__`` and ``__delattr__``) as source text and
``exec``s it: ~0.5 ms per class, ~2 ms for :class:`~smith_fast.service.config.Limits` (48 fields).
Start-up creates some twenty of these classes, most of them built a few times and never compared:
measured, ~12 ms of a ~85 ms start was that ``exec``.

``record`` takes the same arguments and keeps what callers rely on: the class is a dataclass to
:func:`dataclasses.fields`, :func:`~dataclasses.replace` and :func:`~dataclasses.asdict` (the
fields, their metadata and defaults are the ones ``dataclasses`` collected), its ``__init__`` takes
the same arguments, ``__eq__`` and ``__hash__`` give the values the generated ones give (a
:class:`~smith_fast.sandbox.Sandbox` keys the zygotes), ``__repr__`` shows what it would, and a
frozen record refuses assignment with :class:`dataclasses.FrozenInstanceError`. Only
``__dataclass_params__`` differs (it says init, repr, eq and frozen are off: ``dataclasses`` did
not add them). The methods read the fields through tables built once per class, so a call costs
a little more than a generated one: use ``record`` for what is built a few times, and keep
``dataclass`` for what the request path makes per call.

Type checkers see ``dataclasses.dataclass`` itself, so a record's constructor is typed as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from reprlib import recursive_repr
from typing import Any, TypeVar

__all__ = ["record"]

_T = TypeVar("_T")

TYPE_CHECKING = False  # not typing's: this module is imported at start-up and typing need not be
if TYPE_CHECKING:
    from dataclasses import dataclass as record
else:

    def record(cls: type[_T] | None = None, /, *, frozen: bool = False, eq: bool = True, repr: bool = True,
               slots: bool = False) -> Any:
        """Make ``cls`` a dataclass as ``dataclasses.dataclass(cls, frozen=..., eq=..., repr=...,
        slots=...)`` would, without generating its methods' code."""

        def wrap(cls: type[_T]) -> type[_T]:
            return _make(cls, frozen=frozen, eq=eq, repr=repr, slots=slots)

        return wrap if cls is None else wrap(cls)


def _make(cls: type[_T], *, frozen: bool, eq: bool, repr: bool, slots: bool) -> type[_T]:
    if not cls.__doc__:
        # dataclasses would compute a signature for the doc (inspect.signature: slow, and ours is generic)
        raise TypeError(f"record {cls.__qualname__} needs a docstring")
    # dataclasses collects the fields, sets __dataclass_fields__ and builds the slotted class; it
    # generates nothing when told to add no method
    made: Any = dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=False, slots=slots)
    cls = made
    fields = dataclasses.fields(made)
    if any(f.kw_only for f in fields) or "InitVar" in str([f.type for f in made.__dataclass_fields__.values()]):
        raise TypeError(f"record {cls.__qualname__}: kw_only fields and InitVar are not supported")
    own = dict(cls.__dict__)  # what the class body defines, which dataclasses would keep
    class_hash = own.get("__hash__", _MISSING)
    explicit_hash = not (class_hash is _MISSING or (class_hash is None and "__eq__" in own))
    methods: dict[str, Any] = {"__init__": _init(cls, fields)}
    if repr:
        methods["__repr__"] = _repr(cls, [f.name for f in fields if f.repr])
    if eq:
        methods["__eq__"] = _eq(cls, [f.name for f in fields if f.compare])
        if frozen and not explicit_hash:  # as dataclasses: the fields compared, unless hash= says otherwise
            methods["__hash__"] = _hash(cls, [f.name for f in fields if (f.compare if f.hash is None else f.hash)])
        elif not explicit_hash:
            setattr(cls, "__hash__", None)  # eq without frozen: unhashable, as dataclasses makes it
    if frozen:
        if "__setattr__" in own or "__delattr__" in own:
            raise TypeError(f"cannot overwrite attribute __setattr__ or __delattr__ in class {cls.__name__}")
        names = {f.name for f in fields}
        methods["__setattr__"] = _frozen_setattr(cls, names)
        methods["__delattr__"] = _frozen_delattr(cls, names)
        if slots:  # pickle and copy would set the slots through the refusing __setattr__ (as dataclasses)
            methods["__getstate__"] = _getstate
            methods["__setstate__"] = _setstate
    for name, method in methods.items():
        if name not in own or (name == "__hash__" and own[name] is None):
            setattr(cls, name, method)
    return cls


_MISSING = dataclasses.MISSING


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """``__init__``: the init fields in order, positional or by name, then their defaults; the
    fields outside ``__init__`` get their defaults; then ``__post_init__``."""
    order = tuple(f.name for f in fields if f.init)
    known = frozenset(order)
    # (name, default, factory) for every field __init__ sets, in field order
    plan = tuple((f.name, f.default, f.default_factory, f.init) for f in fields
                 if f.init or f.default is not _MISSING or f.default_factory is not _MISSING)
    post_init = getattr(cls, "__post_init__", None)
    assign = object.__setattr__  # a frozen record's own __setattr__ refuses
    name = cls.__qualname__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(order):
            raise TypeError(f"{name}.__init__() takes {len(order) + 1} positional arguments but {len(args) + 1} were given")
        given = dict(zip(order, args))
        for key in kwargs:
            if key not in known:
                raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}")
            if key in given:
                raise TypeError(f"{name}.__init__() got multiple values for argument {key!r}")
        given.update(kwargs)
        for field, default, factory, init in plan:
            if init and field in given:
                value = given[field]
            elif default is not _MISSING:
                value = default
            elif factory is not _MISSING:
                value = factory()
            else:
                raise TypeError(f"{name}.__init__() missing 1 required positional argument: {field!r}")
            assign(self, field, value)
        if post_init is not None:
            self.__post_init__()

    __init__.__qualname__ = f"{name}.__init__"
    return __init__


def _values(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The named attributes of an object as a tuple (attrgetter gives a bare value for one name)."""
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    if not names:
        return lambda obj: ()
    return attrgetter(*names)


def _eq(cls: type, names: list[str]) -> Callable[[Any, Any], Any]:
    values = _values(names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    __eq__.__qualname__ = f"{cls.__qualname__}.__eq__"
    return __eq__


def _hash(cls: type, names: list[str]) -> Callable[[Any], int]:
    values = _values(names)

    def __hash__(self: Any) -> int:
        return hash(values(self))

    __hash__.__qualname__ = f"{cls.__qualname__}.__hash__"
    return __hash__


def _repr(cls: type, names: list[str]) -> Callable[[Any], str]:
    @recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({shown})"

    __repr__.__qualname__ = f"{cls.__qualname__}.__repr__"
    return __repr__


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for field, value in zip(dataclasses.fields(self), state):
        object.__setattr__(self, field.name, value)


def _frozen_setattr(cls: Any, names: set[str]) -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr(cls: Any, names: set[str]) -> Callable[[Any, str], None]:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__
