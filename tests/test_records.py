"""``record`` behaves as ``dataclass`` where callers look: construction, repr, eq, hash, frozen, replace, pickle."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import pickle
from typing import Any

import pytest

from smith_fast import records
from smith_fast.records import record
from smith_fast.sandbox import Sandbox
from smith_fast.service.config import Limits, ServiceConfig


def _twins(frozen: bool, slots: bool) -> tuple[Any, Any]:
    """The same class body under ``record`` and under ``dataclass``."""

    def body() -> dict[str, Any]:
        return {
            "__doc__": "A test record.",
            "__annotations__": {"a": "int", "b": "str", "c": "tuple[int, ...]", "d": "int"},
            "b": "x",
            "c": dataclasses.field(default_factory=tuple, compare=False),
            "d": dataclasses.field(init=False, repr=False, default=5),
        }

    return (record(frozen=frozen, slots=slots)(type("R", (), body())),
            dataclasses.dataclass(frozen=frozen, slots=slots)(type("R", (), body())))


def _outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except Exception as e:  # the class and message are what is compared
        return (type(e), str(e))


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("slots", [True, False])
def test_record_acts_as_the_dataclass(frozen: bool, slots: bool) -> None:
    seen = []
    for cls in _twins(frozen, slots):
        one, same, other = cls(1), cls(a=1, b="x", c=(9,)), cls(2, "y")
        seen.append([
            repr(one), repr(other), one == same, one != other, one == (1, "x"), dataclasses.asdict(same),
            [f.name for f in dataclasses.fields(cls)], repr(dataclasses.replace(one, b="z")),
            _outcome(lambda: hash(one) == hash(same) == hash((1, "x", 5))),
            _outcome(lambda: setattr(one, "a", 3)), _outcome(lambda: delattr(other, "b")),
            _outcome(lambda: pickle.loads(pickle.dumps(same)) == same), copy.deepcopy(same) == same,
            _outcome(lambda: cls()), _outcome(lambda: cls(1, a=1)), _outcome(lambda: cls(q=1)),
        ])
    assert seen[0] == seen[1]


def test_start_up_classes_have_no_generated_code() -> None:
    for cls in (Limits, ServiceConfig, Sandbox):
        for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__"):
            # dataclasses execs its methods' text: their code comes from "<string>"
            assert getattr(cls, name).__code__.co_filename != "<string>", (cls, name)
        assert cls.__init__.__code__.co_filename == records.__file__


def test_sandbox_keys_by_its_compared_fields() -> None:
    # a session's zygote is found by its Sandbox: equal configurations must be one key
    one, same = Sandbox(root="/var/tmp/a"), Sandbox(root="/var/tmp/a", wrapper=("other",))
    assert one == same and hash(one) == hash(same) and {one: 1}[same] == 1
    assert Sandbox(root="/var/tmp/b") != one
    compared = tuple(getattr(one, f.name) for f in dataclasses.fields(Sandbox) if f.compare)
    assert hash(one) == hash(compared)


def test_service_config_repr_hides_the_token() -> None:
    config = ServiceConfig(root=pathlib.Path("/var/tmp"), token="s3cret")
    assert "s3cret" not in repr(config) and "max_frame_size=" in repr(config)
    assert dataclasses.replace(config, planner="llm").token == "s3cret"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.token = "other"  # type: ignore[misc]


def test_record_needs_a_docstring() -> None:
    with pytest.raises(TypeError, match="docstring"):
        record(type("Bare", (), {"__annotations__": {"a": "int"}}))
