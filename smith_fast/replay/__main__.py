"""``python -m smith_fast.replay LOG ...``: ``smith-fast replay`` run directly."""

import sys

from .cli import main

sys.exit(main())
