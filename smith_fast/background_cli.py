"""``smith-fast ps``, ``attach ID`` and ``kill ID``: the background processes of a running service
(PROTOCOL.md, "Background processes"; ``smith-fast exec -d`` starts one).

As ``docker ps/attach/kill``: an ID may be given by any unique prefix; ``attach`` mirrors the
output (retained, then live) and exits with the process's exit code, Ctrl-C detaches and leaves it
running; ``kill`` stops it (SIGTERM, SIGKILL after the service's ``--kill-grace``) and returns once
it has exited. Each needs ``--connect``: a service spawned for one command would end with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.json_format import MessageToDict

from .options import HelpFormatter, error_text

if TYPE_CHECKING:
    from .client import Client, RemoteProcess
    from .pb import smith_pb2 as pb

__all__ = ["add_parsers", "run", "resolve"]

_LIVE_ONLY = 1 << 63  # an offset past the end: only what comes from now on

EXAMPLES = {
    "ps": """\
  smith-fast ps --connect 127.0.0.1:7878
  smith-fast ps --connect unix:/run/smith.sock -q          # ids only
  smith-fast ps --connect 127.0.0.1:7878 --json | jq .state""",
    "attach": """\
  id=$(smith-fast exec -d --connect 127.0.0.1:7878 'make test')
  smith-fast attach --connect 127.0.0.1:7878 $id            # all its output so far, then live
  smith-fast attach --connect 127.0.0.1:7878 --from 4096 ${id:0:8}""",
    "kill": """\
  smith-fast kill --connect 127.0.0.1:7878 3f2a             # any unique prefix of the id""",
}

_HELP = {
    "ps": ("list the background processes of a service",
           "List the background processes of the service at --connect (started with `smith-fast exec -d`), "
           "oldest first: id, shell pid, state (running, stopping, exited), exit code, age, bytes of output "
           "written (OUTPUT) and kept for attach (KEPT), command."),
    "attach": ("follow a background process's output",
               "Print the output of background process ID from byte OFFSET (default 0: all that is kept), then live, "
               "and exit with its exit code (128+N when killed by signal N). When stdin is not a terminal and the "
               "process has open stdin, stdin is forwarded to it. Ctrl-C detaches: the process keeps running. "
               "ID may be any unique prefix."),
    "kill": ("stop a background process",
             "Stop background process ID (SIGTERM to its process group, SIGKILL after the service's --kill-grace), "
             "wait until it has exited and print its id. ID may be any unique prefix."),
}


def add_parsers(sub: Any, client_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``ps``, ``attach`` and ``kill`` to the ``smith-fast`` subcommands."""
    parsers = {}
    for name, (short, description) in _HELP.items():
        parsers[name] = p = sub.add_parser(name, help=short, description=description, epilog="examples:\n" + EXAMPLES[name],
                                           formatter_class=HelpFormatter, allow_abbrev=False)
        if name != "ps":
            p.add_argument("id", metavar="ID", help="the background process (its id, or a unique prefix of it)")
        client_options(p)
    parsers["ps"].add_argument("-q", "--quiet", action="store_true", help="print the ids only")
    parsers["ps"].add_argument("--json", action="store_true", help="one JSON object per process")
    parsers["attach"].add_argument("--from", dest="from_offset", type=int, default=0, metavar="OFFSET",
                                   help="first byte of its output wanted (default 0; dropped bytes: from the oldest kept)")


class _Unknown(Exception):
    """An ID that names no background process, or more than one."""


async def resolve(client: Client, given: str) -> pb.BackgroundProcess:
    """The background process ``given`` names: its id, or a unique prefix of it."""
    found = await client.list_processes()
    exact = [p for p in found if p.id == given]
    matches = exact or [p for p in found if p.id.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    where = client.address or "the service"
    if not matches:
        raise _Unknown(f"no background process {given} on {where} (smith-fast ps --connect {where} lists them)")
    raise _Unknown(f"{given} names {len(matches)} background processes on {where}: " + ", ".join(p.id for p in matches) + "; give more of the id")


Connect = Callable[[argparse.Namespace], Awaitable["Client"]]
Handshake = Callable[["Client", argparse.Namespace, list[str]], Awaitable[None]]
FeedStdin = Callable[[asyncio.AbstractEventLoop, "RemoteProcess"], None]
Mirror = Callable[["RemoteProcess"], Awaitable[int]]


async def run(args: argparse.Namespace, connect: Connect, handshake: Handshake, feed_stdin: FeedStdin, mirror: Mirror) -> int:
    """Run ``ps``, ``attach`` or ``kill``; the exit status. The rest are ``exec``'s own pieces (cli.py):
    connecting, the handshake, forwarding stdin, mirroring output."""
    from .client import SmithError

    if not args.connect:
        print(f"smith-fast {args.command}: needs --connect ADDR: background processes live in a running service", file=sys.stderr)
        return 2
    client = await connect(args)
    try:
        await handshake(client, args, ["shell_exec"])
        if args.command == "ps":
            return await _ps(client, args)
        target = await resolve(client, args.id)
        if args.command == "kill":
            return await _kill(client, target)
        return await _attach(client, target, args, feed_stdin, mirror)
    except _Unknown as exc:
        print(f"smith-fast {args.command}: {error_text(exc)}", file=sys.stderr)
        return 1
    except SmithError as exc:
        print(f"smith-fast {args.command}: {error_text(exc)}", file=sys.stderr)
        return 1
    finally:
        await client.close()


def _age(ms: int) -> str:
    seconds = max(int(time.time() - ms / 1000), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


async def _ps(client: Client, args: argparse.Namespace) -> int:
    found = await client.list_processes()
    if args.quiet:
        for p in found:
            print(p.id)
        return 0
    if args.json:
        for p in found:
            print(json.dumps(MessageToDict(p, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)))
        return 0
    rows = [("ID", "PID", "STATE", "EXIT", "AGE", "OUTPUT", "KEPT", "COMMAND")]
    for p in found:
        rows.append((p.id, str(p.pid), p.state, str(p.exit_code) if p.HasField("exit_code") else "-", _age(p.started_ms),
                     str(p.next_offset), str(p.retained), p.command.replace("\n", " ")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


async def _kill(client: Client, target: pb.BackgroundProcess) -> int:
    if target.state == "exited":
        print(f"smith-fast kill: {target.id} has already exited (exit code {target.exit_code})", file=sys.stderr)
        return 1
    client.cancel(target.id)
    proc = await client.attach(target.id, _LIVE_ONLY)
    await proc.wait()
    print(target.id)
    return 0


async def _attach(client: Client, target: pb.BackgroundProcess, args: argparse.Namespace, feed_stdin: FeedStdin, mirror: Mirror) -> int:
    from .client import SmithError

    loop = asyncio.get_running_loop()
    proc = await client.attach(target.id, max(args.from_offset, 0))
    stopped: list[int] = []

    def detach(sig: int) -> None:
        stopped.append(sig)
        proc.detach()

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for sig in handled:
        loop.add_signal_handler(sig, detach, sig)
    if target.stdin_open and not os.isatty(0):
        threading.Thread(target=feed_stdin, args=(loop, proc), name="smith-fast-stdin", daemon=True).start()
    try:
        code = await mirror(proc)
    except SmithError:
        if not stopped:
            raise
        code = 0
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
    if stopped:
        where = client.address or "the service"
        print(f"smith-fast: detached from {target.id}; it keeps running (smith-fast kill --connect {where} {target.id} stops it)",
              file=sys.stderr)
        return 128 + stopped[0]
    return code if code >= 0 else 128 - code
