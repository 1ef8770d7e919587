"""``smith-fast checkpoint``, ``restore ID``, ``diff FROM [TO]`` and ``undo REQUEST_ID``: a session's
workspace on a service started with ``serve --workspaces DIR`` (PROTOCOL.md, "Workspaces").

A fresh connection is a fresh session with a fresh workspace, so these act on a session that
``smith-fast exec --keep-session`` left parked: it prints ``session: HANDLE`` on stderr, and each of
these takes ``--session HANDLE``, does its work, leaves the session parked again and prints the
handle to use next (the same token; it also says how much of the session's output was already
seen). A parked session lives for the service's ``--resume-window`` (30 s by default) after the last
connection left it. ``diff FROM TO`` of two checkpoints needs no session.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .options import HelpFormatter, error_text

if TYPE_CHECKING:
    from .client import Change, Client

__all__ = ["EXAMPLES", "add_parsers", "parse_session", "run", "session_handle", "resume", "park", "print_changes"]

EXAMPLES = {
    "checkpoint": """\
  smith-fast checkpoint --connect 127.0.0.1:7878 --session $s --label built   # prints the checkpoint's id
  smith-fast checkpoint --connect unix:/run/smith.sock --session $s           # $s: what exec --keep-session printed""",
    "restore": """\
  smith-fast restore --connect 127.0.0.1:7878 --session $s 5f0c2a...          # back to that checkpoint
  smith-fast restore --connect unix:/run/smith.sock --session $s $(cat ck)    # prints the requests it cancelled""",
    "diff": """\
  smith-fast diff --connect 127.0.0.1:7878 CK1 CK2                    # two checkpoints: no session needed
  smith-fast diff --connect 127.0.0.1:7878 --session $s CK1 --patch   # CK1 to the session's workspace now
  smith-fast diff --connect 127.0.0.1:7878 CK1 CK2 --path src --max-diff 64K""",
    "undo": """\
  smith-fast undo --connect 127.0.0.1:7878 --session $s 0b9e41...     # what that request changed, put back
  smith-fast undo --connect 127.0.0.1:7878 --session $s 0b9e41... --force""",
}

_HELP = {
    "checkpoint": ("freeze a session's workspace as a checkpoint",
                   "Freeze the workspace of session --session (the HANDLE `smith-fast exec --keep-session` printed after `session: `) "
                   "as it is now and print the checkpoint's id (stdout). "
                   "Restore it with `smith-fast restore`, compare with `smith-fast diff`, or start a new session from it "
                   "with `smith-fast exec --fork ID`."),
    "restore": ("put a session's workspace back to a checkpoint",
                "Put the workspace of session --session back as it was at checkpoint ID. Its running requests are "
                "cancelled first and its background processes killed; their ids are printed (stdout)."),
    "diff": ("what differs between two checkpoints",
             "Print what differs from checkpoint FROM to checkpoint TO (or, with --session and no TO, to that session's "
             "workspace now): one line per path, `A`dded, `M`odified or `D`eleted, its size and its path; with --patch "
             "the unified diffs of text files. Exits 0 whether or not anything differs."),
    "undo": ("put back what one request changed",
             "Put back what request REQUEST_ID (a command or an fs.write of session --session, which must have been "
             "started with --keep-session) changed, and print what was put back as `diff` does. A path a later request "
             "changed too is left alone and named (exit 1), unless --force."),
}


def add_parsers(sub: Any, client_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``checkpoint``, ``restore``, ``diff`` and ``undo`` to the ``smith-fast`` subcommands
    (``client_options``: exec's ``--connect``, ``--token`` ...)."""
    from .options import UNITS

    parsers = {}
    for name, (short, description) in _HELP.items():
        parsers[name] = p = sub.add_parser(name, help=short, description=description, epilog="examples:\n" + EXAMPLES[name],
                                           formatter_class=HelpFormatter, allow_abbrev=False)
        client_options(p)
        p.add_argument("--session", metavar="HANDLE",
                           help="the parked session to act on: what `smith-fast exec --keep-session` printed after `session: `"
                           + (" (not needed for FROM TO)" if name == "diff" else ""))
    parsers["checkpoint"].add_argument("--label", default="", help="a name for people (the id is the service's)")
    parsers["restore"].add_argument("id", metavar="ID", help="the checkpoint")
    parsers["diff"].add_argument("from_id", metavar="FROM", help="a checkpoint")
    parsers["diff"].add_argument("to_id", metavar="TO", nargs="?", help="a checkpoint (default: the session's workspace now)")
    parsers["diff"].add_argument("--patch", "-p", action="store_true", help="print the unified diffs of text files too")
    parsers["diff"].add_argument("--path", dest="paths", action="append", default=[], metavar="PATH",
                                 help="only beneath this path, relative to the workspace root (repeatable)")
    parsers["diff"].add_argument("--max-diff", type=UNITS["bytes"].parse, default=0, metavar="SIZE",
                                 help="unified diffs up to this many bytes in all (default: the service's)")
    parsers["undo"].add_argument("request_id", metavar="REQUEST_ID", help="the request whose changes to put back")
    parsers["undo"].add_argument("--force", action="store_true", help="also put back paths a later request changed too")


_HANDLE_PREFIX = "s."
"""Begins every handle: a resume token is URL-safe base64, which may begin with ``-``, and then
``--session HANDLE`` read it as an option (one run in 64); ``.`` is in no token."""


def session_handle(client: Client) -> str:
    """What ``session: `` shows: the resume token and the last sequence seen (what to resume after)."""
    return f"{_HANDLE_PREFIX}{client.resume_token}:{client.last_sequence}"


def parse_session(handle: str) -> tuple[str, int]:
    """A handle (``s.TOKEN:SEQ``, ``TOKEN:SEQ``, or a bare token) → ``(token, resume after)``."""
    handle = handle.removeprefix(_HANDLE_PREFIX)
    token, sep, after = handle.rpartition(":")
    if sep and after.isdigit() and token:
        return token, int(after)
    return handle, 0


async def resume(client: Client, handle: str, timeout: float) -> None:
    """Carry on the parked session ``handle`` names over ``client``'s new connection."""
    token, after = parse_session(handle)
    await client.resume_session(token, after, timeout=timeout)


async def park(client: Client) -> None:
    """Leave the session parked again and say on stderr how to come back to it.

    Raises:
        ValueError: the service did not make the session resumable (its ``--resume-window`` is 0).
    """
    if not client.resume_token:
        raise ValueError("the service cannot keep this session (is its --resume-window 0?): it ended with this command")
    handle = session_handle(client)
    await client.park()
    print(f"session: {handle}", file=sys.stderr)


def print_changes(changes: list[Change], patch: bool) -> None:
    """``A/M/D  SIZE  PATH`` lines (the size after the change; before it, for a deletion); with
    ``patch``, each text file's unified diff after its line."""
    width = max((len(str(c.size if c.kind != "deleted" else c.old_size)) for c in changes), default=1)
    for c in changes:
        size = c.size if c.kind != "deleted" else c.old_size
        kind = c.letter + ("/" if c.file_type == "dir" else "")
        print(f"{kind:<2} {size:>{width}}  {c.path}")
        if patch and c.unified_diff:
            sys.stdout.write(c.unified_diff if c.unified_diff.endswith("\n") else c.unified_diff + "\n")


Connect = Callable[[argparse.Namespace], Awaitable["Client"]]
Handshake = Callable[["Client", argparse.Namespace, list[str]], Awaitable[None]]


async def run(args: argparse.Namespace, connect: Connect, handshake: Handshake) -> int:
    """Run ``checkpoint``, ``restore``, ``diff`` or ``undo``; the exit status. ``connect`` and
    ``handshake`` are ``exec``'s own (cli.py)."""
    from .client import SmithError

    command = args.command
    if not args.connect:
        print(f"smith-fast {command}: needs --connect ADDR: a workspace lives in a running service", file=sys.stderr)
        return 2
    if args.protocol != "v1":
        print(f"smith-fast {command}: workspaces are protocol v1 only (drop --protocol {args.protocol})", file=sys.stderr)
        return 2
    needs_session = command != "diff" or args.to_id is None
    if needs_session and not args.session:
        what = "diff FROM without TO compares with a session's workspace now" if command == "diff" else f"{command} acts on a session's workspace"
        print(f"smith-fast {command}: needs --session HANDLE: {what}, and a fresh connection is a fresh session "
              "(`smith-fast exec --keep-session` prints one)", file=sys.stderr)
        return 2
    client = await connect(args)
    parked = False
    try:
        if args.session:
            await resume(client, args.session, args.connect_timeout)
        else:
            await handshake(client, args, ["workspaces"])
        code = await _act(client, args)
        if args.session:
            await park(client)
            parked = True
        return code
    except SmithError as exc:
        print(f"smith-fast {command}: {error_text(exc)}", file=sys.stderr)
        if args.session and client.ready is not None and client.ready.resumed and not parked:
            await park(client)  # what was refused changed nothing: the session stays for the next try
            parked = True
        return 1
    finally:
        if not parked:
            await client.close()


async def _act(client: Client, args: argparse.Namespace) -> int:
    if args.command == "checkpoint":
        print(await client.checkpoint(args.label))
        return 0
    if args.command == "restore":
        for rid in await client.restore(args.id):
            print(rid)
        return 0
    if args.command == "diff":
        changes = await client.diff(args.from_id, args.to_id, max_diff_bytes=args.max_diff, paths=args.paths)
        print_changes(changes, args.patch)
        if client.diff_truncated:
            print("smith-fast diff: the list or the diffs were cut at the service's limit (--max-diff, --path narrow it)", file=sys.stderr)
        return 0
    result = await client.undo(args.request_id, force=args.force)
    print_changes(result.changes, False)
    for path in result.conflicts:
        print(f"smith-fast undo: {path} was left alone: a later request changed it too (--force puts it back anyway)", file=sys.stderr)
    return 1 if result.conflicts else 0
