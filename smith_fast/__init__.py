"""smith-fast: a fast backend for the Smith tool-execution protocol."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
