# Augments session.py (compiled in place, smith_fast/_compat.py): the session as an extension type,
# its fields in a C struct, so that its own methods (the dispatch of every command) read them
# without a dictionary look-up. Every field it sets is declared here; others set the public ones
# (the fronts: authenticated, presented_token; the starter and resume: last_active).
cdef class Session:
    cdef public object core, sink, peer, version, protocol, granted, accepted, handshaken, shutting
    cdef public object flow, requests, session_id, authenticated, denied, presented_token, last_active
    cdef public object span, recorder, runner, workspace, egress
    cdef public object _unsent, _resume, _starter, _batches, _reporter, _close, _closing, _loop
