# Augments metrics.py (compiled in place, smith_fast/_compat.py): the per-request counters as
# extension types, their fields (their __slots__) in C structs.
cdef class IOCounters:
    cdef public object frames_in, frames_out, bytes_in, bytes_out

cdef class Histogram:
    cdef public object bounds, counts, sum, count
