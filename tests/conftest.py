"""Shared fixtures and checks.

- The twin fixtures (``impl``, ``framing``, ``chunking``, ...; ``harness/twins.py``, shared with the
  benchmarks): every wire-core test runs on the Cython and the Python twin, ids ``[c]``/``[py]``.
- ``run``: the one event-loop fixture; a test takes it to run coroutines on stdlib asyncio and on
  uvloop (ids ``[asyncio]``/``[uvloop]``), each on a fresh loop whose exception handler must not
  fire. A module overrides ``after_loop`` to check, once the loop is closed, that it leaked nothing.
- ``assert_same_api``: the one twin-parity check, a twin's API against the Python twin's.
- The suite run from a script's ``make test &`` (SIGINT and SIGQUIT ignored, which every process a
  test starts in this process would inherit) gets both back at their defaults, as in a terminal.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import uvloop

from harness.twins import (  # noqa: F401  (fixtures and helpers the tests use)
    IMPLEMENTATIONS,
    chunking,
    coalescing,
    events,
    framing,
    impl,
    relaypeek,
    sequencing,
    twin,
)

# A test that runs a command in this process (ShellProcess, a terminal) and sends it SIGINT or
# SIGQUIT expects it to end by it, as it would from a terminal's `make test`; a shell without job
# control ignores both for what it starts in the background, and the commands would inherit that.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what Python sets when SIGINT is not ignored
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]
LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.fixture
def after_loop() -> Callable[[], None]:
    """What a module checks once a ``run`` test's loop is closed (nothing here): a module overrides
    this fixture to assert that it leaked nothing (shells, hook processes)."""
    return lambda: None


def _grpc_poller_of_another_loop(context: dict[str, Any]) -> bool:
    """grpc.aio's process-wide completion queue is bound to every loop that used it: each test's
    loop, here. An event may then be handled by one loop for another, already closed (its
    ``call_soon_threadsafe`` raises), or read by one loop while another looks too (``BlockingIOError``):
    grpc/grpc#25364, which clients filter as this does. Nothing of ours: every other context counts."""
    exc = context.get("exception")
    return "PollerCompletionQueue._handle_events" in str(context.get("message", "")) and (
        isinstance(exc, BlockingIOError) or (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"))


@pytest.fixture(params=sorted(LOOP_FACTORIES))
def run(request: pytest.FixtureRequest, after_loop: Callable[[], None]) -> Iterator[Runner[Any]]:
    """Run a coroutine on a fresh loop of the parametrized kind (ids ``[asyncio]``/``[uvloop]``);
    once it is closed, check that its exception handler never fired (but for grpc.aio's handling of
    another loop's events: :func:`_grpc_poller_of_another_loop`), then ``after_loop``."""
    fired: list[dict[str, Any]] = []

    def handler(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not _grpc_poller_of_another_loop(context):
            fired.append(context)

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[request.param]) as runner:
        runner.get_loop().set_exception_handler(handler)
        yield runner.run
    assert fired == [], f"the loop's exception handler fired: {fired}"
    after_loop()


def public_members(cls: type) -> dict[str, Any]:
    """The public attributes of ``cls``, inherited ones included."""
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


def assert_same_api(module: str, impl: str = "c") -> None:
    """Assert that twin ``impl`` of ``module`` exports what the Python twin (the specification) does:
    the same names in the same order, equal constants, and for every function, class and public class
    member the same docstring and signature (names, kinds, defaults; annotations differ between the
    twins). A class's public members are the same set, properties stay properties. The one signature
    that may be unknown is a cdef class's ``__init__``: Cython does not expose it."""
    mine, ref = twin(module, impl), twin(module, "py")
    assert mine.__all__ == ref.__all__
    for name in ref.__all__:
        a, b = getattr(mine, name), getattr(ref, name)
        if not callable(b):
            assert a == b, name
            continue
        assert a.__doc__ == b.__doc__, name
        if not isinstance(b, type):
            assert _params(a) == _params(b), name
            continue
        init = _params(a.__init__)
        assert init is _SLOT or init == _params(b.__init__), f"{name}.__init__"
        assert public_members(a).keys() == public_members(b).keys(), name
        for attr, ref_value in public_members(b).items():
            value = getattr(a, attr)
            assert value.__doc__ == ref_value.__doc__, f"{name}.{attr}"
            if callable(ref_value):
                assert _params(value) == _params(ref_value), f"{name}.{attr}"
            else:
                assert isinstance(ref_value, property) and hasattr(value, "__get__"), f"{name}.{attr}"


_SLOT: list[tuple[str, object, object]] = []  # the "signature" of a slot wrapper: see _params


def _params(func: object) -> list[tuple[str, object, object]]:
    """Parameter names, kinds and defaults; :data:`_SLOT` for a slot wrapper of a cdef class, whose
    signature Cython does not expose."""
    params = [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]  # type: ignore[arg-type]
    if [p[0] for p in params] in (["self", "args", "kwargs"], ["args", "kwargs"]):
        return _SLOT
    return params
