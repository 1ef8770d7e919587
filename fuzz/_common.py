"""Plumbing shared by the harnesses: instrumentation, the libFuzzer entry point, outcome comparison.

A harness is a module ``fuzz/fuzz_<target>.py`` with a ``test_one_input(data: bytes) -> None`` that
raises (``AssertionError`` for a broken invariant, anything else for a crash) on a bad input. Run
as ``python -m fuzz.fuzz_<target> [libFuzzer flags] [corpus dirs]`` it fuzzes that function; imported
(by ``tests/test_fuzz.py``) it is a plain function that replays corpus files.
"""

from __future__ import annotations

import contextlib
import importlib
import pathlib
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

__all__ = ["FUZZ_DIR", "Outcome", "assert_same", "fuzz_main", "instrumented", "outcome", "twins"]

FUZZ_DIR = pathlib.Path(__file__).resolve().parent


@contextlib.contextmanager
def instrumented(module_name: str) -> Iterator[None]:
    """Instrument the ``smith_fast`` modules imported inside the block, when fuzzing.

    Only a harness run as ``__main__`` is instrumented: a test that imports the harness to replay
    its corpus runs the plain code (and has imported ``smith_fast`` long before anyway).
    """
    if module_name != "__main__":
        yield
        return
    import atheris

    with atheris.instrument_imports(include=["smith_fast"]):
        yield


def twins(name: str) -> tuple[ModuleType, ModuleType]:
    """``(smith_fast._<name>_c, smith_fast._<name>_py)``; the Python twin twice in a pure build.

    With ``SMITH_FAST_NO_EXTENSIONS=1`` there is no compiled twin to compare with (as in
    ``tests/conftest.py``, only ``[py]`` runs): the harness then checks its invariants on the Python
    twin alone, run twice in lockstep.
    """
    from smith_fast._compat import NO_EXTENSIONS

    py = importlib.import_module(f"smith_fast._{name}_py")
    return (py if NO_EXTENSIONS else importlib.import_module(f"smith_fast._{name}_c")), py


def fuzz_main(test_one_input: Callable[[bytes], None], dictionary: str | None = None) -> None:
    """Hand ``test_one_input`` to libFuzzer with this process's command-line flags; never returns.

    Args:
        test_one_input: the harness function.
        dictionary: a libFuzzer dictionary file in ``fuzz/``, used unless ``-dict=`` is given.
    """
    import atheris

    argv = list(sys.argv)
    if dictionary and not any(arg.startswith("-dict=") for arg in argv):
        argv.insert(1, f"-dict={FUZZ_DIR / dictionary}")
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


# ("ok", value) or ("err", exception type, message, extra attributes)
Outcome = tuple[Any, ...]


def outcome(call: Callable[..., Any], *args: Any, attrs: tuple[str, ...] = (), **kwargs: Any) -> Outcome:
    """Run ``call`` and describe what happened, so two implementations can be compared.

    Args:
        call: the function under test.
        args: its positional arguments; ``kwargs`` its keyword arguments.
        attrs: exception attributes that are part of the outcome (``offset``, ``frames`` ...).

    Returns:
        ``("ok", result)`` or ``("err", type, str(exc), {attr: value})``.
    """
    try:
        return ("ok", call(*args, **kwargs))
    except RecursionError:
        raise  # never an expected outcome: let it surface as a crash
    except Exception as exc:  # noqa: BLE001 - the comparison is the point; the caller vets the type
        return ("err", type(exc), str(exc), {a: getattr(exc, a, None) for a in attrs})


def assert_same(a: Outcome, b: Outcome, what: str) -> None:
    """Assert that two outcomes are identical, with a message that shows both."""
    assert a == b, f"{what}: the twins disagree\n  c:  {a!r:.2000}\n  py: {b!r:.2000}"
