# Augments smith_fast/service/request.py (compiled in place, smith_fast/_compat.py): Request as an
# extension type, its fields in a C struct (its __slots__).
cdef class Request:
    cdef public object _host, _limits, id, spec, _command, call, state, task, span, audit, early, processes
    cdef public object stdin_target, cancelled, cancel_reason
