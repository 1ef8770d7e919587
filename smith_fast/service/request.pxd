# Augments smith_fast/service/request.py (compiled in place, smith_fast/_compat.py): Request as an
# extension type, its fields in a C struct. It had __slots__ already: no field is added or lost.
cdef class Request:
    cdef public object _host, _limits, id, spec, command, state, task, span, audit, early, processes
    cdef public object stdin_target, cancelled, cancel_reason
