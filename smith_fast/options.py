"""Command-line options described once: the units they take and the config fields they set.

Every ``Limits``/``ServiceConfig`` field a command exposes carries an :class:`Option` in its
dataclass metadata (``service/config.py``); :func:`add_options` turns those into argparse options
for one command (``serve``, ``worker`` or ``gateway``) and :func:`values` reads them back, so a
flag's name, help, unit and default are written in one place.

Units on the command line:

* sizes: bytes, with an optional ``k``/``M``/``G`` suffix (``65536``, ``64k``, ``16M``);
* durations: seconds, with an optional ``ms``/``s``/``m``/``h`` suffix (``1.5``, ``500ms``, ``2m``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from .records import record

__all__ = [
    "ADDRESS_FORMS",
    "DURATIONS",
    "SIZES",
    "Alias",
    "HelpFormatter",
    "MAX_DURATION",
    "MAX_SIZE",
    "Option",
    "Unit",
    "UNITS",
    "add_options",
    "check_key_file",
    "current_directory",
    "error_text",
    "format_duration",
    "format_size",
    "option",
    "parse_duration",
    "parse_size",
    "secret",
    "values",
]

SIZES = "sizes are bytes with an optional k/M/G suffix (64k, 16M)"
DURATIONS = "Durations are seconds with an optional ms/s/m/h suffix (1.5, 500ms, 2m)"
ADDRESS_FORMS = "unix:PATH, PATH (containing /), tcp:HOST:PORT, HOST:PORT or grpc:HOST:PORT"

MAX_SIZE = (1 << 63) - 1
"""The largest size an option takes (bytes): what a signed 64-bit count holds."""
MAX_DURATION = 1e9
"""The longest duration an option takes (seconds, ~31 years): longer ones (``1e400`` is infinite)
overflowed a timer or the wire's ``timeout_ms`` (a traceback, or protobuf's "Value out of range")."""

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_DURATION_UNITS = {"ms": 0.001, "": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_size(text: str) -> int:
    """``65536``, ``64k``, ``16M``, ``1G`` (``KiB``/``MB`` spellings too) → bytes.

    Raises:
        ValueError: not a size (argparse reports it as ``invalid parse_size value``).
    """
    match = _NUMBER.match(text.lower())
    suffix = match.group(2).removesuffix("ib").removesuffix("b") if match else ""
    if match is None or suffix not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size (bytes, or with a k/M/G suffix)")
    number = match.group(1)
    size = (int(number) if number.isdigit() else float(number)) * _SIZE_UNITS[suffix]  # exact where it can be
    if not size <= MAX_SIZE:
        raise ValueError(f"{text!r} is larger than any size (at most {MAX_SIZE} bytes)")
    return int(size)


def parse_duration(text: str) -> float:
    """``1.5``, ``500ms``, ``30s``, ``2m``, ``1h`` → seconds.

    Raises:
        ValueError: not a duration.
    """
    match = _NUMBER.match(text.lower())
    if match is None or match.group(2) not in _DURATION_UNITS:
        raise ValueError(f"{text!r} is not a duration (seconds, or with a ms/s/m/h suffix)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not seconds <= MAX_DURATION:
        raise ValueError(f"{text!r} is longer than any duration (at most {MAX_DURATION:g} s)")
    return seconds


def secret(flag_value: str | None, env: str = "SMITH_TOKEN", environ: Mapping[str, str] | None = None) -> str | None:
    """A secret from its flag, else from ``$env`` (the safer place: arguments show in ``ps``); empty means none."""
    return flag_value or (os.environ if environ is None else environ).get(env) or None


def _milliseconds(text: str) -> int:
    return round(parse_duration(text) * 1000)


def format_size(n: int) -> str:
    """16777216 → ``16M``; what :func:`parse_size` reads back."""
    for suffix, factor in (("G", 1 << 30), ("M", 1 << 20), ("k", 1 << 10)):
        if n and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)


def format_duration(seconds: float) -> str:
    """2.0 → ``2s``, 0.5 → ``500ms``."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


# argparse reports a failed type conversion with the function's __name__
parse_size.__name__ = "size"
parse_duration.__name__ = "duration"
_milliseconds.__name__ = "duration"
_names.__name__ = "list"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that an epilog of examples keeps its lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


@record(frozen=True)
class Unit:
    """How one kind of value is read from the command line and shown in ``--help``.

    Attributes:
        parse: argparse ``type``: text → the field's value.
        metavar: placeholder in ``--help``.
        show: field value → the text ``--help`` and README give as its default.
    """

    parse: Callable[[str], Any]
    metavar: str | None
    show: Callable[[Any], str]


UNITS: dict[str, Unit] = {
    "bytes": Unit(parse_size, "SIZE", format_size),
    "seconds": Unit(parse_duration, "DURATION", format_duration),
    # the field holds milliseconds; the flag takes a duration like every other
    "milliseconds": Unit(_milliseconds, "DURATION", lambda ms: format_duration(ms / 1000)),
    "count": Unit(int, "N", str),
    "whole milliseconds": Unit(int, "MS", str),  # the older --timeout-ms spelling
    "text": Unit(str, None, str),
    "path": Unit(pathlib.Path, "PATH", str),
    "choice": Unit(str, None, str),
    "names": Unit(_names, "LIST", lambda v: ",".join(sorted(v))),
    "switch": Unit(bool, None, lambda on: "on" if on else "off"),  # a flag that takes no value
}


@record(frozen=True)
class Alias:
    """An older spelling of an option, kept working (``--timeout-ms`` for ``--timeout``)."""

    flag: str
    unit: str
    help: str


@record(frozen=True)
class Option:
    """The command-line side of one config field.

    Attributes:
        flag: ``--max-output`` ...
        help: what it does (the default is appended).
        unit: a key of :data:`UNITS`.
        commands: the commands that take it (``serve``, ``worker``, ``gateway``).
        group: the ``--help`` section it is listed under.
        choices: allowed values, for ``unit="choice"``.
        repeat: the flag may be given several times (the field holds a tuple or frozenset).
        metavar: overrides the unit's placeholder.
        default_text: what ``--help`` says the default is, when the value is not telling
            (computed defaults such as the current directory).
        env: environment variable read when the flag is not given (``SMITH_TOKEN``).
        aliases: older spellings that still work.
    """

    flag: str
    help: str
    unit: str
    commands: frozenset[str]
    group: str
    choices: tuple[str, ...] = ()
    repeat: bool = False
    metavar: str | None = None
    default_text: str | None = None
    env: str | None = None
    aliases: tuple[Alias, ...] = ()


def option(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, repr: bool = True, **kwargs: Any) -> Any:
    """A ``dataclasses.field`` whose metadata is an :class:`Option` built from ``kwargs``."""
    commands = kwargs.pop("commands")
    meta = {"option": Option(commands=frozenset(commands), **kwargs)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, repr=repr, metadata=meta)
    return dataclasses.field(default=default, repr=repr, metadata=meta)


def _options(cls: type, command: str) -> Iterable[tuple[dataclasses.Field[Any], Option]]:
    for f in dataclasses.fields(cls):
        opt = f.metadata.get("option")
        if isinstance(opt, Option) and command in opt.commands:
            yield f, opt


def current_directory(flag: str, value: str = "DIR") -> pathlib.Path:
    """The current directory, as the default of ``flag`` (whose value the message calls ``value``).

    Raises:
        ValueError: it was removed (the shell's ``cd`` still names it): what to do instead.
    """
    try:
        return pathlib.Path.cwd()
    except FileNotFoundError:
        raise ValueError(f"the current directory was removed: cd to one that exists, or give {flag} {value}") from None


# What a command-line user does about a refusal, by its ``details["reason"]``: the service's words
# say what is wrong, the command line knows how its user puts it right.
_REMEDIES = {"unauthenticated": "give the service's token in $SMITH_TOKEN, or --token"}


def error_text(exc: BaseException) -> str:
    """An error as a command prints it: its text, and for a refusal with a known remedy, the remedy."""
    details = getattr(exc, "details", None)  # a SmithError's (errors.py); the others have none
    remedy = _REMEDIES.get(details.get("reason", "")) if isinstance(details, dict) else None
    return f"{exc} ({remedy})" if remedy else str(exc)


def check_key_file(path: str, flag: str) -> None:
    """Refuse a private key (``flag``'s file) that every local account may read.

    Group read is left alone: a key shared with a group of its own (Debian's ``ssl-cert``, mode
    0640) is the usual way to let a service read it.

    Raises:
        ValueError: others may read it (what to run instead), or it cannot be read.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot be read: {exc.strerror or exc}") from None
    if mode & 0o004:
        raise ValueError(f"{flag} {path}: every local account may read it (mode {mode & 0o7777:04o}); a key others can read "
                         f"is not a secret: chmod 600 {path}")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]  # MISSING only for a field without a default: never an Option


def _dest(f: dataclasses.Field[Any]) -> str:
    return f"opt_{f.name}"


def add_options(parser: argparse.ArgumentParser, cls: type, command: str, groups: dict[str, Any] | None = None) -> None:
    """Add the options of ``cls``'s fields that ``command`` takes to ``parser``.

    ``groups`` maps section titles to argument groups already made, so that several dataclasses
    can share sections; new sections are added to it.
    """
    groups = {} if groups is None else groups
    for f, opt in _options(cls, command):
        if opt.group not in groups:
            groups[opt.group] = parser.add_argument_group(opt.group)
        group = groups[opt.group]
        unit = UNITS[opt.unit]
        if opt.repeat:
            text = f"{opt.help} (repeatable)"
        else:
            # the default is made only to be shown: a factory's (the current directory) may fail
            # at this point (the directory removed), which is for the command to say, if it needs it
            shown = opt.default_text or ("none" if (default := _default(f)) is None else unit.show(default))
            text = f"{opt.help} (default {shown}" + (f"; ${opt.env}" if opt.env else "") + ")"
        kwargs: dict[str, Any] = {"dest": _dest(f), "help": text, "type": unit.parse}
        if opt.metavar or unit.metavar:
            kwargs["metavar"] = opt.metavar or unit.metavar
        if opt.choices:
            kwargs["choices"] = opt.choices
        if opt.repeat:
            group.add_argument(opt.flag, action="append", default=[], **kwargs)
        elif opt.unit == "switch":
            group.add_argument(opt.flag, dest=kwargs["dest"], help=kwargs["help"], action="store_const", const=True, default=None)
        else:
            group.add_argument(opt.flag, default=None, **kwargs)
        for alias in opt.aliases:
            alias_unit = UNITS[alias.unit]
            group.add_argument(alias.flag, dest=_dest(f), default=None, type=alias_unit.parse,
                               metavar=alias_unit.metavar, help=alias.help)


def values(args: argparse.Namespace, cls: type, command: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``cls`` that the options :func:`add_options` added describe.

    Fields whose flag was not given keep the dataclass default (an ``env`` variable fills
    them first when set and not empty).

    Raises:
        ValueError: a flag with an ``env`` fallback (a secret) was given empty.
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for f, opt in _options(cls, command):
        value = getattr(args, _dest(f))
        if opt.repeat:
            if value:
                out[f.name] = (frozenset if isinstance(_default(f), frozenset) else tuple)(value)
            continue
        if value is not None and opt.env and not value:
            raise ValueError(f"{opt.flag} must not be empty")
        if value is None and opt.env:
            value = env.get(opt.env) or None
        if value is not None:
            out[f.name] = value
    return out
