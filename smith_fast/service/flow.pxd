# Augments flow.py (compiled in place, smith_fast/_compat.py): a session's budget and flow as
# extension types, their fields (their __slots__) in C structs.
cdef class OutputBudget:
    cdef public object limit, reserved, paused, _unsent, _waiting

cdef class SessionFlow:
    cdef public OutputBudget budget
    cdef public object paused, waiting_bytes, _reading, _hold, _held
