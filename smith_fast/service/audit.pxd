# Augments audit.py (compiled in place, smith_fast/_compat.py): the session's audit and a request's
# record as extension types, their fields (their __slots__) in C structs.
cdef class AuditRecord:
    cdef public object fields, started, decisions, omitted

cdef class Audit:
    cdef public object _session, _peer, _find, _steps, workspace, _head, _ms, _ts
