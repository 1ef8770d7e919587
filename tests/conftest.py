"""Shared fixtures.

Every test of a wire-core module takes that module's twin fixture (``framing``, ``chunking``, ...),
which is parametrized over the implementations: the test id ends in ``[c]`` or ``[py]``. In a normal
build both run, and a compiled twin that fails to import fails its tests (no skip). With
``SMITH_FAST_NO_EXTENSIONS=1`` only ``[py]`` is collected. The fixtures are session-scoped (the
modules are stateless), which also lets hypothesis ``@given`` tests use them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from smith_fast._compat import NO_EXTENSIONS

IMPLEMENTATIONS = ["py"] if NO_EXTENSIONS else ["c", "py"]


def twin(module: str, impl: str) -> ModuleType:
    """Import ``smith_fast._<module>_<impl>``."""
    return importlib.import_module(f"smith_fast._{module}_{impl}")


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def framing(impl: str) -> ModuleType:
    return twin("framing", impl)


@pytest.fixture(scope="session")
def chunking(impl: str) -> ModuleType:
    return twin("chunking", impl)


@pytest.fixture(scope="session")
def sequencing(impl: str) -> ModuleType:
    return twin("sequencing", impl)


@pytest.fixture(scope="session")
def coalescing(impl: str) -> ModuleType:
    return twin("coalescing", impl)


@pytest.fixture(scope="session")
def events(impl: str) -> ModuleType:
    return twin("events", impl)


def assert_same_api(module: str) -> None:
    """Assert that both twins of ``module`` export the same names, docstrings and signatures."""
    import inspect

    c, py = twin(module, "c"), twin(module, "py")
    assert sorted(c.__all__) == sorted(py.__all__)
    for name in py.__all__:
        a, b = getattr(c, name), getattr(py, name)
        if not callable(b):
            assert a == b, name
            continue
        assert inspect.getdoc(a) == inspect.getdoc(b), name
        members = [(name, a, b)]
        if isinstance(b, type):
            members += [
                (f"{name}.{attr}", getattr(a, attr), getattr(b, attr))
                for attr in vars(b)
                if not attr.startswith("_") or attr == "__init__"
            ]
        for qual, x, y in members:
            if qual != name:
                assert inspect.getdoc(x) == inspect.getdoc(y), qual
            if callable(y) and not isinstance(y, type):
                assert _params(x) in (None, _params(y)), qual


def _params(func: object) -> list[tuple[str, object]] | None:
    """Parameter names, kinds and defaults (annotations differ between the twins); None if unknown."""
    import inspect

    try:
        sig = inspect.signature(func)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    params = [(p.name, p.kind, p.default) for p in sig.parameters.values()]
    if [p[0] for p in params] in (["self", "args", "kwargs"], ["args", "kwargs"]):
        return None  # a slot wrapper of a cdef class: Cython does not expose its signature
    return params
