# Augments request_start.py (compiled in place, smith_fast/_compat.py): the starter as an extension
# type, its fields (its __slots__) in a C struct.
cdef class RequestStarter:
    cdef public object _session, _flow, _limits, _metrics, _loop
