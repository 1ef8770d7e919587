# Augments csrc/_sequencing_c.py, a symlink to smith_fast/_sequencing_py.py: the same code
# compiled as the extension types declared here. Cython's compiler looks a module's augmenting
# .pxd up by the module's full name (smith_fast/_sequencing_c.pxd on the include path csrc/),
# while cythonize's rebuild check looks beside the source: this file serves the rebuild check, and
# the symlink csrc/smith_fast/_sequencing_c.pxd -> ../_sequencing_c.pxd serves the compiler. A
# .pxd the compiler misses is ignored silently (the module then compiles untyped);
# tests/test_sequencing.py catches that.
import cython

cdef object _MISSING

@cython.final
cdef class Sequencer:
    cdef object _clock
    cdef unsigned long long _last
    cdef object _timestamp
    cpdef tuple next(self)

@cython.final
cdef class Resequencer:
    cdef dict _held
    cdef unsigned long long _window, _first, _expected
    cdef unsigned long long _delivered, _duplicates, _gaps, _reordered

    @cython.locals(seq=cython.ulonglong)
    cpdef list push(self, object sequence, object item)
    cpdef list flush(self)
    @cython.locals(expected=cython.ulonglong, start=cython.ulonglong)
    cdef int _drain(self, list out) except -1
    @cython.locals(expected=cython.ulonglong, span=cython.ulonglong, found=cython.ulonglong,
                   count=cython.ulonglong)
    cdef int _skip_to(self, unsigned long long floor, list out) except -1
