"""Network egress by name: the proxy a ``--network allow`` sandbox reaches the network through.

The sandbox has no route and no DNS; its commands get ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``
pointing at a listener the service made inside the sandbox's network namespace, served here, on
the service's loop, outside the sandbox. One listener speaks three protocols, told apart by the
first byte: HTTP ``CONNECT`` (HTTPS and any TCP), plain HTTP in absolute form (``GET http://host/``,
forwarded) and SOCKS5 (no authentication, CONNECT; names resolved here, so ``socks5h://`` works).

Each attempt is decided by :class:`EgressPolicy` (see :mod:`smith_fast.egress.policy` for the
order: deny, hook, allow, every resolved address), the proxy resolves the name itself and connects
to the address it checked (no second resolution, so DNS rebinding cannot swap it).

Secrets (``--egress-secret NAME@HOST=ENV``): the command's ``NAME`` holds a random placeholder; in
plain-HTTP requests to HOST the proxy puts the real value where the placeholder is in the request
headers; to any other host the placeholder goes out unchanged, so the real value never leaves for
the wrong host. HTTPS (CONNECT, or TLS over SOCKS5) is opaque to the proxy: its headers cannot be
rewritten without TLS interception, and TLS interception (a CA the sandbox trusts) is NOT offered
in this version. What is offered instead: substitution in plain HTTP, and
:meth:`EgressPolicy.redact` (``[secret NAME]`` for every real value) for command output and logs.
A service that needs a credential over HTTPS should fetch through a plain-HTTP endpoint on a
trusted network, or hand the command a token scoped for exposure.

Bounds (:class:`EgressLimits`, one field per ``--egress-*`` option of serve and worker): ``max_head`` (64 KiB
of request head or SOCKS5 handshake, else 431), ``handshake_timeout`` (10 s to name a destination;
also bounds the hook), ``connect_timeout`` (10 s to resolve and connect, else 504 / SOCKS5 0x04),
``idle_timeout`` (300 s without a byte either way closes a tunnel), ``max_connections`` (256 at once
per served listener; more are closed at accept, with a ``limit`` Record).

Relaying is zero-copy (:mod:`~smith_fast.egress.splice`: ``splice(2)`` through a pipe, driven by
the loop); see ``bench/bench_egress.py`` for what it costs against a direct download, and
``bench/bench_egress_relay.py`` for the variants measured against it.

The seam with the service (egs): :class:`EgressPolicy` (``from_options``, ``narrowed``,
``placeholders``, ``redact``), :class:`EgressProxy` (``serve`` a listening socket with an
:class:`Observer`, or ``start_tcp``), :class:`Served` (``close``, ``wait_closed``), and the values
:class:`Attempt`, :class:`Verdict`, :class:`Record` an observer hears.
"""

from __future__ import annotations

from .attempts import Attempt, NullObserver, Observer, Record, Verdict, Via
from .limits import EgressLimits
from .policy import EgressPolicy, Secret
from .proxy import EgressProxy, Served
from .resolver import OverrideResolver, Resolver, SystemResolver, parse_overrides
from .rules import Rule, parse_rule

__all__ = [
    "EgressPolicy", "Rule", "Secret", "parse_rule",
    "Attempt", "Verdict", "Record", "Observer", "NullObserver", "Via",
    "EgressProxy", "Served", "EgressLimits",
    "Resolver", "SystemResolver", "OverrideResolver", "parse_overrides",
]
