"""The package's version, in a module of its own: modules inside the package read it from here, not
from ``smith_fast/__init__.py``, which is the public face (it re-exports the client) and sits above
them all (ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
