"""``smith-fast replay LOG``: print a session log, or replay it against a service and diff.

Wired into ``smith_fast.cli`` with :func:`add_parser` and :func:`run`. Exit codes: 0 when the
replay matched (or the log was printed), 1 when there are differences, 2 on errors (unreadable
log, no service to talk to).
"""

from __future__ import annotations

import argparse
import base64
import asyncio
import json
import shlex
import sys
from typing import IO, Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError

from ..options import ADDRESS_FORMS, DURATIONS, HelpFormatter, parse_duration, secret
from .format import LogFormatError
from .reader import LogReader, Record, read_log
from .replayer import Replayer

__all__ = ["add_parser", "main", "print_log", "run"]

_EXAMPLES = """examples:
  smith-fast replay session.smithrec --print | head
  smith-fast replay session.smithrec --spawn --fast --serve-args "--root /srv/work"
  smith-fast replay session.smithrec --against unix:/run/smith.sock --timeout 5s
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``replay`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``).

    Returns:
        The new subparser.
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="print or replay a recorded session log",
        description="Print a session log (--print), or re-send its commands to a service (--against ADDR or "
        "--spawn) and compare the events with the recorded ones, ignoring timestamps, durations, ids, "
        f"sequence numbers and how output was chunked. Exits 1 when they differ, 2 on errors. {DURATIONS}.",
        epilog=_EXAMPLES, formatter_class=HelpFormatter, allow_abbrev=False,
    )
    p.add_argument("log", metavar="LOG", help="a .smithrec session log")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", dest="print_log", help="print the log as JSON lines")
    mode.add_argument("--against", metavar="ADDR", help=f"replay against the service at ADDR: {ADDRESS_FORMS}")
    mode.add_argument("--spawn", action="store_true", help="replay against a fresh `smith-fast serve --stdio`")
    p.add_argument("--serve-args", default="", metavar="ARGS", help="with --spawn: extra serve arguments, shell-quoted (e.g. \"--root /srv\")")
    p.add_argument("--fast", action="store_true", help="do not keep the recorded pacing: send each command once what preceded it has happened")
    p.add_argument("--protocol", choices=["v1", "v0"], help="wire protocol to replay with (default: the recorded session's)")
    p.add_argument("--timeout", type=parse_duration, default=30.0, metavar="DURATION",
                   help="how long to wait for a request to end before going on (default 30s)")
    p.add_argument("--settle", type=parse_duration, default=1.0, metavar="DURATION",
                   help="how long to wait at the end for outstanding events (default 1s)")
    p.add_argument("--token", metavar="TOKEN", help="the shared secret of the service replayed against (default: $SMITH_TOKEN)")
    return p


def print_log(path: str, out: IO[str]) -> None:
    """Write the log as JSON lines: the header, one object per record, then a torn-tail line if any.

    Raises:
        LogFormatError: not a session log.
        OSError: unreadable.
    """
    with LogReader(path) as reader:
        header = reader.header
        out.write(json.dumps({"header": {**header.to_json(), "format_version": header.format_version}}) + "\n")
        for i, record in enumerate(reader):
            line: dict[str, Any] = {
                "record": i,
                "direction": "in" if record.inbound else "out",
                "t_ms": round(record.offset_ns / 1e6, 3),
            }
            if record.raw:
                line["kind"] = record.kind
                line.update(_raw_fields(record))
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
                continue
            try:
                line["envelope"] = MessageToDict(record.parse(), preserving_proto_field_name=True)
            except DecodeError as exc:
                line["error"] = f"not an Envelope: {exc}"
                line["size"] = len(record.envelope)
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
        if reader.torn is not None:
            torn = reader.torn
            out.write(json.dumps({"torn_tail": {"offset": torn.offset, "size": torn.size, "reason": torn.reason}}) + "\n")


def _raw_fields(record: Record) -> dict[str, Any]:
    """How ``--print`` shows inbound bytes kept as they arrived: as text when they are UTF-8."""
    if record.kind == "discarded":
        try:
            what = record.discarded()
        except ValueError as exc:
            return {"error": str(exc)}
        return {"offset": what.offset, "size": what.size, "complete": what.complete, "head_hex": what.head.hex()}
    try:
        return {"text": record.envelope.decode("utf-8"), "size": len(record.envelope)}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(record.envelope).decode(), "size": len(record.envelope)}


def run(args: argparse.Namespace) -> int:
    """Carry out ``smith-fast replay``; returns the exit code."""
    try:
        if args.print_log:
            print_log(args.log, sys.stdout)
            return 0
        header, records, torn = read_log(args.log)
    except (LogFormatError, OSError) as exc:
        print(f"smith-fast replay: {exc}", file=sys.stderr)
        return 2
    protocol = {"v1": 1, "v0": 0}.get(args.protocol) if args.protocol else None
    try:
        token = secret(args.token)
        replayer = Replayer(header, records, torn=torn, fast=args.fast, protocol=protocol, timeout=args.timeout, settle=args.settle, token=token)
        if args.spawn:
            result = asyncio.run(replayer.spawn(*shlex.split(args.serve_args)))
        else:
            result = asyncio.run(replayer.against(args.against))
    except (OSError, ValueError) as exc:
        print(f"smith-fast replay: {exc}", file=sys.stderr)
        return 2
    target = "a spawned service" if args.spawn else args.against
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if result.identical:
        print(f"replayed {result.sent} commands against {target}: identical ({result.recorded.events} events)")
        return 0
    print(f"--- recorded {args.log}")
    print(f"+++ replayed against {target}")
    for line in result.differences:
        print(line)
    print(f"replayed {result.sent} commands: the events differ ({result.recorded.events} recorded, {result.replayed.events} replayed)")
    return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m smith_fast.replay``: the same command without the ``smith-fast`` front end."""
    parser = argparse.ArgumentParser(prog="smith-fast", allow_abbrev=False)
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["replay", *(sys.argv[1:] if argv is None else argv)]))
