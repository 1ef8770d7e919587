# Augments request_table.py (compiled in place, smith_fast/_compat.py): the table as an extension
# type, its fields (its __slots__) in a C struct.
cdef class RequestTable:
    cdef public object _host, _limits, live, _ended, owed
