# The C spawner (csrc/sandbox_spawn.c); smith_fast/sandbox/spawner.py is its one caller.
def spawn(
    path: bytes,
    argv: list[bytes],
    envp: list[bytes],
    cwd: bytes | None,
    fds: tuple[int, int, int],
    cgroup_procs: list[bytes],
    readable: list[bytes],
    writable: list[bytes],
    /,
) -> tuple[int, int]: ...
