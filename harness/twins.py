"""The twins of the wire core, as pytest fixtures for tests/ and bench/ alike.

Every test or benchmark of a wire-core module takes that module's twin fixture (``framing``,
``chunking``, ...), parametrized over the implementations: its id ends in ``[c]`` or ``[py]``. In a
normal build both run, and a compiled twin that fails to import fails (no skip). With
``SMITH_FAST_NO_EXTENSIONS=1`` only ``[py]`` is collected. The fixtures are session-scoped (the
modules are stateless), which also lets hypothesis ``@given`` tests use them. A conftest.py makes
them available by importing them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from smith_fast._compat import NO_EXTENSIONS

__all__ = ["IMPLEMENTATIONS", "chunking", "coalescing", "events", "framing", "impl", "relaypeek", "sequencing", "twin"]

IMPLEMENTATIONS = ["py"] if NO_EXTENSIONS else ["c", "py"]


def twin(module: str, impl: str) -> ModuleType:
    """Import ``smith_fast._<module>_<impl>``."""
    return importlib.import_module(f"smith_fast._{module}_{impl}")


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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


@pytest.fixture(scope="session")
def relaypeek(impl: str) -> ModuleType:
    return twin("relaypeek", impl)
