"""Shared fixtures.

Every test of a wire-core module takes that module's twin fixture (``framing``, ``chunking``, ...),
which is parametrized over the implementations: the test id ends in ``[c]`` or ``[py]``. In a normal
build both run, and a compiled twin that fails to import fails its tests (no skip). With
``SMITH_FAST_NO_EXTENSIONS=1`` only ``[py]`` is collected.
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


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def framing(impl: str) -> ModuleType:
    return twin("framing", impl)


@pytest.fixture
def chunking(impl: str) -> ModuleType:
    return twin("chunking", impl)


@pytest.fixture
def sequencing(impl: str) -> ModuleType:
    return twin("sequencing", impl)


@pytest.fixture
def coalescing(impl: str) -> ModuleType:
    return twin("coalescing", impl)


@pytest.fixture
def events(impl: str) -> ModuleType:
    return twin("events", impl)
