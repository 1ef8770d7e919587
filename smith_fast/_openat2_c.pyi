# The compiled openat2 call (csrc/_openat2_c.pyx); smith_fast/tools/openat2.py is its one caller.
__all__ = ["openat2"]

def openat2(dirfd: int, path: bytes, flags: int, mode: int, resolve: int) -> int: ...
