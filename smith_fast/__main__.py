"""``python -m smith_fast``, and the ``smith-fast`` command (pyproject's entry point).

A start of ``serve --mcp`` imports some 400 modules and builds a parser, a config and a core: a
few hundred thousand objects, none of them garbage, through which the cyclic collector ran some 70
times before the first answer (~10 ms of ~150). So the collector is off from here to the end of
the start, where :func:`smith_fast.cli.main` freezes what the start made (never garbage: kept out
of every later collection too) and turns it back on.
"""

import gc


def main() -> int:
    gc.disable()  # before the imports below: cli.main turns it back on once started
    from .cli import main as run

    return run()


if __name__ == "__main__":
    raise SystemExit(main())
