# Augments csrc/_coalescing_c.py, a symlink to smith_fast/_coalescing_py.py: the same code
# compiled as the extension types declared here. Cython's compiler looks a module's augmenting
# .pxd up by the module's full name (smith_fast/_coalescing_c.pxd on the include path csrc/),
# while cythonize's rebuild check looks beside the source: this file serves the rebuild check, and
# the symlink csrc/smith_fast/_coalescing_c.pxd -> ../_coalescing_c.pxd serves the compiler. A
# .pxd the compiler misses is ignored silently (the module then compiles untyped);
# tests/test_coalescing.py catches that.
import cython

cdef list _HEADERS
cdef bytes _FIELD2_TRUE

cdef bytes _header(Py_ssize_t n)
cdef bytes _as_bytes(object data)

cdef class _Batcher:
    cdef list _parts
    cdef Py_ssize_t _count, _size, _max_count, _budget
    cdef double _deadline, _linger
    cdef bytes _more, _last

    @cython.locals(n=Py_ssize_t, size=Py_ssize_t, count=Py_ssize_t, cut=bint, header=bytes,
                   deadline=cython.double)
    cpdef list add(self, object message, object now=*)
    cpdef list poll(self, object now)
    cpdef list flush(self)
    @cython.locals(parts=list)
    cdef bytes _cut(self, bytes trailer)

@cython.final
cdef class EventBatcher(_Batcher):
    pass

@cython.final
cdef class CommandBatcher(_Batcher):
    pass

@cython.final
cdef class WriteCoalescer:
    cdef list _frames
    cdef Py_ssize_t _size, _max

    cpdef object add(self, object frame)
    @cython.locals(frames=list)
    cpdef bytes flush(self)
