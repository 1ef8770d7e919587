"""Build- and run-time switches, read once.

``SMITH_FAST_NO_EXTENSIONS=1`` (any value but empty or ``0``) makes every facade pick its
pure-Python twin even where the compiled one is installed.
"""

from __future__ import annotations

import os

NO_EXTENSIONS: bool = os.environ.get("SMITH_FAST_NO_EXTENSIONS", "") not in ("", "0")
