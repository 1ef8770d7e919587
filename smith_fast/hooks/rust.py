"""Rust hooks: compiled once with the system ``rustc``, run as a long-lived child process each.

**Compile.** :mod:`.rust_build` compiles the source with the prelude, once per machine (cached).

**Run.** Each :class:`RustHook` runs its binary as a child: its own session and process group, an
empty environment, a private temporary working directory, ``RLIMIT_DATA`` at the memory limit and no
core dumps. Requests go to its stdin, one JSON line each; answers come back one JSON line each on a
separate pipe whose descriptor is the child's argv[1], so whatever the hook prints on stdout or
stderr cannot corrupt the protocol (it is logged). One request at a time (an ``asyncio.Lock``).

**Fail.** A panic is caught in the child (``catch_unwind``) and answered as an error: the call fails,
the child keeps its state and goes on. An abort, a crash, a closed pipe, a garbled answer or a call
past the time limit kills the child's process group and fails the call; the next call starts a new
child. Nothing the child does reaches the service beyond a failed call.

Rust hooks are native code with the service user's rights, narrowed by ``HookLimits.sandbox`` (the
service's ``--sandbox``: it may write only its working directory): the process boundary contains
crashes and runaway loops; the sandbox limits writes and the network, not reads (HOOKS.md, "Trust").
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import Any

from .. import childguard
from ..sandbox import Sandbox
from .model import TRIGGERS, Decision, Hook, HookFailure, HookLimits, HookLoadError, clip, decode_decision, dumps, loads, log
from .rust_check import check_rust_source
from .rust_build import cache_key, compile_hook, default_cache_dir, rustc_path, rustc_version

__all__ = [
    "MAX_ANSWER",
    "RustHook",
    "cache_key",
    "compile_hook",
    "default_cache_dir",
    "load_rust",
    "rustc_path",
    "rustc_version",
]

MAX_ANSWER = 64 << 20
"""An answer line longer than this kills the child (a transform of a huge tool result still fits)."""
_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_ALLOW_LINE = b'{"action":"allow"}'
_DESCRIBE = b'{"trigger":"__describe__"}\n'
_START_TIMEOUT = 5.0  # the first answer of a new child: process start-up on a loaded machine

_LIVE: weakref.WeakSet[RustHook] = weakref.WeakSet()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class _Timeout(Exception):
    pass


class _Child:
    """One running hook binary and its three pipes."""

    __slots__ = ("proc", "loop", "stdin", "answers", "output", "buf", "outbuf", "waiter", "dead", "hook_id")

    def __init__(self, exe_fd: int, workdir: str, memory_bytes: int, hook_id: str, sandbox: Sandbox | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.hook_id = hook_id
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        ans_r, ans_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            for fd in (in_w, ans_w):
                try:
                    fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
                except OSError:
                    pass  # above /proc/sys/fs/pipe-max-size: the default size only costs wakeups
            # Executed through a descriptor opened at load (fexecve-style): a restart still works
            # after the cache entry was deleted.
            argv = [f"/proc/self/fd/{exe_fd}", str(ans_w)]
            self.proc = subprocess.Popen(
                sandbox.wrap(argv, writable=[workdir], data_size=memory_bytes) if sandbox is not None else argv,
                stdin=in_r,
                stdout=out_w,
                stderr=out_w,
                pass_fds=(ans_w, exe_fd),
                env={},  # nothing for the hook, and so nothing for the sandbox program (wrap_environ)
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            for fd in (in_r, in_w, ans_r, ans_w, out_r, out_w):
                _close(fd)
            raise
        for fd in (in_r, ans_w, out_w):
            _close(fd)
        childguard.register(self.proc.pid)  # a hook stuck in a loop must not outlive a killed service
        # Set from outside: the child does nothing but wait on stdin until the first request.
        try:
            resource.prlimit(self.proc.pid, resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
            resource.prlimit(self.proc.pid, resource.RLIMIT_CORE, (0, 0))
        except (OSError, ValueError) as exc:
            log.warning("cannot limit a rust hook", extra={"fields": {"hook_id": hook_id, "error": str(exc)}})
        for fd in (in_w, ans_r, out_r):
            os.set_blocking(fd, False)
        self.stdin, self.answers, self.output = in_w, ans_r, out_r
        self.buf = bytearray()
        self.outbuf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None
        self.dead: str | None = None
        self.loop.add_reader(ans_r, self._read_answers)
        self.loop.add_reader(out_r, self._read_output)

    def _read_answers(self) -> None:
        try:
            data = os.read(self.answers, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            data = b""
            self.dead = f"answer pipe failed: {exc}"
        if not data:
            self.loop.remove_reader(self.answers)
            self._fail(self.dead or "its process died")
            return
        start = len(self.buf)
        self.buf += data
        end = self.buf.find(b"\n", start)  # a long answer arrives in many reads: scan only the new bytes
        if end < 0:
            if len(self.buf) > MAX_ANSWER:
                self.loop.remove_reader(self.answers)
                self.buf.clear()
                self._fail(f"answered more than {MAX_ANSWER} bytes")
            return
        line = bytes(self.buf[:end])
        del self.buf[: end + 1]
        waiter, self.waiter = self.waiter, None
        if self.buf or waiter is None or waiter.done():
            # More than one answer, or one nobody asked for: something in the child writes to the
            # answer pipe on its own. Whoever is waiting gets the first line; the child is replaced.
            self.dead = "answered out of turn"
        if waiter is not None and not waiter.done():
            waiter.set_result(line)

    def _read_output(self) -> None:
        try:
            data = os.read(self.output, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(self.output)
            _close(self.output)
            self.output = -1
            if self.outbuf:
                self._log_line(bytes(self.outbuf))
            return
        self.outbuf += data
        *lines, rest = self.outbuf.split(b"\n")
        for line in lines:
            self._log_line(bytes(line))
        self.outbuf = bytearray(rest[-4096:])

    def _log_line(self, line: bytes) -> None:
        text = clip(line.decode("utf-8", "replace"), 2000)
        log.info("hook output", extra={"fields": {"hook_id": self.hook_id, "text": text}})

    def _fail(self, reason: str) -> None:
        """The child is unusable: note why, wake the caller (it kills the child)."""
        if self.dead is None:
            self.dead = reason
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(_ChildDied(self.dead))

    async def request(self, line: bytes, timeout: float) -> bytes:
        """Send one request line, wait for its answer line."""
        if self.dead is not None:
            raise _ChildDied(self.dead)
        waiter: asyncio.Future[bytes] = self.loop.create_future()
        self.waiter = waiter
        timer = self.loop.call_later(timeout, _expire, waiter)
        try:
            view = memoryview(line)
            while view:
                try:
                    sent = os.write(self.stdin, view)
                except BlockingIOError:
                    await self._writable()
                    continue
                except BrokenPipeError:
                    raise _ChildDied("its process died") from None
                view = view[sent:]
            return await waiter
        finally:
            timer.cancel()
            self.waiter = None

    async def _writable(self) -> None:
        ready: asyncio.Future[None] = self.loop.create_future()
        self.loop.add_writer(self.stdin, _wake, ready)
        waiters: set[asyncio.Future[Any]] = {ready} if self.waiter is None else {ready, self.waiter}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.loop.remove_writer(self.stdin)
        if self.waiter is not None and self.waiter.done():
            self.waiter.result()  # raises the timeout or the death

    def kill(self) -> str:
        """Kill the process group, reap, close the pipes; returns how the process ended."""
        _killpg(self.proc.pid)
        if self.dead is None:
            self.dead = "killed"
        childguard.unregister(self.proc.pid)  # before the reap, which frees the group id
        try:
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:  # uninterruptible: Popen reaps it later
            code = None
        for fd in (self.answers, self.output):
            if fd >= 0:
                try:
                    self.loop.remove_reader(fd)
                except Exception:  # the loop it was registered with is closed already
                    pass
        for fd in (self.stdin, self.answers, self.output):
            if fd >= 0:
                _close(fd)
        self.stdin = self.answers = self.output = -1
        if code is None or code == -signal.SIGKILL:
            return ""
        if code < 0:
            try:
                return f" (killed by {signal.Signals(-code).name})"
            except ValueError:
                return f" (killed by signal {-code})"
        return f" (exit status {code})"


class _ChildDied(Exception):
    pass


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _expire(waiter: asyncio.Future[bytes]) -> None:
    if not waiter.done():
        waiter.set_exception(_Timeout())


class RustHook(Hook):
    """A compiled Rust hook served by a child process. Make one with :func:`load_rust`.

    Attributes:
        executable: the cached binary.
        cache_hit: True if the load found the binary in the cache, False if it compiled it.
        restarts: how many times a child was started after the first (each failure that killed one).
    """

    kind = "rust"

    def __init__(self, source_hash: str, executable: Path, limits: HookLimits, hook_id: str, cache_hit: bool) -> None:
        self.source_hash = source_hash
        self.id = hook_id
        self.executable = executable
        self.limits = limits
        self.cache_hit = cache_hit
        self.triggers = frozenset()
        self.restarts = -1
        self._allow = Decision("allow", hook_id=hook_id)
        self._child: _Child | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._exe_fd = os.open(executable, os.O_RDONLY | os.O_CLOEXEC)
        self._workdir = tempfile.mkdtemp(prefix="smith-fast-hook-")
        self._closed = False
        _LIVE.add(self)

    def _start(self) -> _Child:
        child = _Child(self._exe_fd, self._workdir, self.limits.memory_bytes, self.id, self.limits.sandbox)
        self.restarts += 1
        self._child = child
        return child

    def _stop(self) -> str:
        child, self._child = self._child, None
        return child.kill() if child is not None else ""

    async def _describe(self) -> list[str]:
        try:
            child = self._start()
        except OSError as exc:
            raise HookLoadError(f"the Rust hook's process does not start: {exc}") from None
        try:
            answer = loads(await child.request(_DESCRIBE, max(self.limits.call_timeout, _START_TIMEOUT)))
            names = answer["triggers"]
            if not isinstance(names, list):
                raise TypeError
        except _Timeout:
            self._stop()
            raise HookLoadError("the Rust hook did not answer its first request in time") from None
        except (_ChildDied, ValueError, KeyError, TypeError) as exc:
            how = self._stop()
            raise HookLoadError(f"the Rust hook did not start properly: {exc}{how}") from None
        return [str(n) for n in names]

    def _serial(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            # A hook used from another event loop (tests; a service restarted in-process): its child's
            # pipes are registered with the old loop, so it starts a new one.
            if self._child is not None and self._child.loop is not loop:
                self._stop()
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def call(self, trigger: str, payload: dict[str, Any]) -> Decision:
        if trigger not in self.triggers:
            return self._allow
        try:
            line = f'{{"trigger":"{trigger}","payload":{dumps(payload)}}}\n'.encode()
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
            raise HookFailure(self.id, trigger, f"its payload is not JSON ({exc})") from None
        async with self._serial():
            if self._closed:
                raise HookFailure(self.id, trigger, "the hook is closed")
            child = self._child
            if child is None or child.dead is not None:
                self._stop()  # died between calls (its pipe closed, it answered out of turn)
                try:
                    child = self._start()
                except OSError as exc:
                    raise HookFailure(self.id, trigger, f"cannot start its process: {exc}") from None
            try:
                answer = await child.request(line, self.limits.call_timeout)
            except _Timeout:
                self._stop()
                raise HookFailure(self.id, trigger, f"ran past its time limit of {self.limits.call_timeout:g} s") from None
            except _ChildDied as exc:
                how = self._stop()
                raise HookFailure(self.id, trigger, f"crashed: {exc}{how}") from None
            except BaseException:
                # Cancelled mid-request: its answer would be taken for the next request's.
                self._stop()
                raise
        if answer == _ALLOW_LINE:
            return self._allow
        if answer.startswith(b'{"error":'):
            try:
                message = loads(answer)["error"]
            except (ValueError, KeyError, TypeError):
                message = clip(answer.decode("utf-8", "replace"), 200)
            raise HookFailure(self.id, trigger, clip(str(message)))
        try:
            return decode_decision(answer, trigger, self.id)
        except HookFailure:
            if not answer.startswith(b'{"action":'):
                # Not the prelude's writing: whatever wrote it may write more. The next call gets a
                # new child.
                child.dead = "answered garbage"
            raise

    call.__doc__ = Hook.call.__doc__

    async def close(self) -> None:
        self._closed = True
        self._stop()
        _LIVE.discard(self)
        if self._exe_fd >= 0:
            _close(self._exe_fd)
            self._exe_fd = -1
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __del__(self) -> None:
        child = getattr(self, "_child", None)
        if child is not None:
            _killpg(child.proc.pid)
        if getattr(self, "_exe_fd", -1) >= 0:
            _close(self._exe_fd)
        if workdir := getattr(self, "_workdir", None):  # a hook never closed left one per load in /tmp
            shutil.rmtree(workdir, ignore_errors=True)


async def load_rust(
    source: str,
    limits: HookLimits = HookLimits(),
    hook_id: str | None = None,
    cache_dir: Path | None = None,
    *,
    trusted: bool = False,
) -> RustHook:
    """Load a Rust hook: compile it (or find it in the cache), start its process, ask it its triggers.

    Args:
        source: Rust source defining hook functions ``fn NAME(p: &Json) -> Action`` and registering
            them with ``hooks! { NAME, ... }`` (HOOKS.md, "Rust hooks").
        limits: its time limit per call, memory limit and compile time limit.
        hook_id: the id to give it (default ``rust-`` + 12 hex digits of the source's SHA-256).
        cache_dir: where compiled hooks live (default :func:`default_cache_dir`).
        trusted: the operator's own source (``serve --hook``): skip :func:`check_rust_source`,
            which otherwise refuses what could read files while compiling or reach the system
            when run (HOOKS.md, "What a session's Rust hook may contain").

    Returns:
        The running hook.

    Raises:
        HookLoadError: a forbidden token (untrusted source), no ``hooks!`` registration, a compile error (``diagnostics`` is rustc's
            output), no working rustc, an unknown trigger name, or a binary that does not start.
    """
    if "hooks!" not in source:
        raise HookLoadError(
            "a Rust hook registers its functions with hooks! { " + ", ".join(TRIGGERS) + " } (any subset)"
        )
    if not trusted:
        check_rust_source(source)  # before rustc reads a byte of it
    source_hash = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    exe, cache_hit = await compile_hook(source, cache_dir=cache_dir, timeout=limits.rust_compile_timeout, sandbox=limits.sandbox)
    try:
        hook = RustHook(source_hash, exe, limits, hook_id or f"rust-{source_hash[:12]}", cache_hit)
    except OSError as exc:  # the binary vanished between the compile and now
        raise HookLoadError(f"cannot open the compiled hook {exe}: {exc}") from None
    try:
        names = await hook._describe()
        unknown = sorted(set(names) - set(TRIGGERS))
        if unknown:
            raise HookLoadError(f"hooks! names unknown trigger(s) {', '.join(unknown)}; known: {', '.join(TRIGGERS)}")
        if not names:
            raise HookLoadError("the Rust hook registers no function in hooks! { ... }")
        hook.triggers = frozenset(names)
    except BaseException:
        await hook.close()
        raise
    return hook


@atexit.register
def _kill_children() -> None:
    for hook in list(_LIVE):
        child = hook._child
        if child is not None:
            _killpg(child.proc.pid)
        shutil.rmtree(hook._workdir, ignore_errors=True)
