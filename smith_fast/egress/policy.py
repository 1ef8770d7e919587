"""The operator's egress rules and secrets, narrowed per session: :class:`EgressPolicy`.

How an attempt is decided (:meth:`EgressPolicy.screen`, then :meth:`EgressPolicy.admit`):

1. ``--egress-deny`` first: a deny rule matching the name (or the IP literal) refuses, whatever
   else says; a deny address rule matching any resolved address refuses too.
2. A hook's verdict (the service's :class:`~smith_fast.egress.attempts.Observer`), when it gives one,
   replaces step 3; it cannot lift step 1 or step 4.
3. Something must allow it: a name needs a name rule in ``--egress-allow`` (and, in a narrowed
   policy, in every session allow-list); an IP literal needs an address rule. A name no rule allows
   is never resolved, so a command cannot leak data through DNS queries for made-up names.
4. Every resolved address (or the IP literal) that is loopback, link-local, private, ... or the
   host's own (:mod:`~smith_fast.egress.addresses`) needs an address rule that allows it; one such
   address refuses the whole name (a name that resolves to a public and a private address is
   refused, not connected to its public half).
"""

from __future__ import annotations

import os
import re
import secrets as _random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..errors import EgressRuleError
from .addresses import OWN, special_kind
from .attempts import Attempt, Verdict
from .rules import IPAddress, Rule, parse_address, parse_rule

__all__ = ["EgressPolicy", "Secret", "PLACEHOLDER_PREFIX"]

PLACEHOLDER_PREFIX = "smith-egress-secret-"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Secret:
    """One ``--egress-secret NAME@HOST=ENV``.

    Attributes:
        name: the environment variable the command gets (holding ``placeholder``).
        host: the rule (a name, ``*.`` subdomains, optional port) of the hosts that get the real value.
        env: the service's environment variable the real value came from.
        value: the real value (never shown: ``repr`` hides it).
        placeholder: ``smith-egress-secret-`` and 24 random hex digits, made when the policy is.
    """

    name: str
    host: Rule
    env: str
    value: str = field(repr=False)
    placeholder: str

    @classmethod
    def parse(cls, text: str, environ: Mapping[str, str]) -> "Secret":
        """Parse ``NAME@HOST=ENV`` and read ENV.

        Raises:
            EgressRuleError: malformed, a host that is no name rule, ENV unset or empty, or a
                value with a line break (it would split a header).
        """
        name, at, rest = text.partition("@")
        host, equals, env = rest.partition("=")
        if not at or not equals or not _NAME.fullmatch(name) or not _NAME.fullmatch(env):
            raise EgressRuleError(f"--egress-secret {text!r}: write NAME@HOST=ENV (NAME and ENV environment variable names)")
        rule = parse_rule(host)
        if rule.kind == "address" or rule.kind == "any-name":
            raise EgressRuleError(f"--egress-secret {text!r}: HOST must be a host name or *.name, not {host!r}")
        value = environ.get(env)
        if not value:
            raise EgressRuleError(f"--egress-secret {text!r}: the service's environment has no {env} (or it is empty)")
        if "\r" in value or "\n" in value or "\0" in value:
            raise EgressRuleError(f"--egress-secret {text!r}: the value of {env} holds a line break or NUL")
        return cls(name, rule, env, value, PLACEHOLDER_PREFIX + _random.token_hex(12))


def _first(rules: Iterable[Rule], host: str, address: IPAddress | None, port: int) -> Rule | None:
    for rule in rules:
        if (rule.matches_address(address, port) if address is not None else rule.matches_name(host, port)):
            return rule
    return None


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The rules an :class:`~smith_fast.egress.proxy.EgressProxy` applies.

    Attributes:
        allow: ``--egress-allow``, in order.
        deny: ``--egress-deny``.
        secrets: ``--egress-secret``.
        narrowed_by: session allow-lists (:meth:`narrowed`): an attempt must match one rule of each too.
        own: the host's own addresses, refused as loopback is (filled by the proxy at start).
    """

    allow: tuple[Rule, ...]
    deny: tuple[Rule, ...]
    secrets: tuple[Secret, ...] = ()
    narrowed_by: tuple[tuple[Rule, ...], ...] = ()
    own: frozenset[IPAddress] = frozenset()

    @classmethod
    def from_options(cls, allow: Sequence[str], deny: Sequence[str], secrets: Sequence[str],
                     environ: Mapping[str, str] | None = None) -> "EgressPolicy":
        """The policy of ``--egress-allow``/``--egress-deny``/``--egress-secret`` values.

        Args:
            environ: where secrets are read (the service's environment when None).

        Raises:
            EgressRuleError: (a ValueError) a value it cannot use; the message names it.
        """
        env = os.environ if environ is None else environ
        parsed = tuple(Secret.parse(text, env) for text in secrets)
        names = [s.name for s in parsed]
        for name in names:
            if names.count(name) > 1:
                raise EgressRuleError(f"--egress-secret: {name} is given twice")
        return cls(tuple(parse_rule(p) for p in allow), tuple(parse_rule(p) for p in deny), parsed)

    def narrowed(self, allow: Sequence[str]) -> "EgressPolicy":
        """This policy, where an attempt must also match one of ``allow`` (a session's handshake).

        It can only narrow: the operator's rules, deny rules and address checks all still apply.

        Raises:
            EgressRuleError: a pattern it cannot parse.
        """
        return replace(self, narrowed_by=self.narrowed_by + (tuple(parse_rule(p) for p in allow),))

    def with_own(self, own: frozenset[IPAddress]) -> "EgressPolicy":
        """This policy with the host's own addresses to refuse."""
        return replace(self, own=own)

    def placeholders(self) -> dict[str, str]:
        """NAME -> placeholder, for the command's environment."""
        return {s.name: s.placeholder for s in self.secrets}

    def redact(self, text: str) -> str:
        """``text`` with every real secret value replaced by ``[secret NAME]`` (output, logs)."""
        for secret in self.secrets:
            if secret.value in text:
                text = text.replace(secret.value, f"[secret {secret.name}]")
        return text

    def redact_bytes(self, data: bytes) -> bytes:
        """:meth:`redact` of bytes (UTF-8 values)."""
        for secret in self.secrets:
            value = secret.value.encode()
            if value in data:
                data = data.replace(value, f"[secret {secret.name}]".encode())
        return data

    def substitutions(self, host: str, port: int) -> tuple[tuple[bytes, bytes], ...]:
        """(placeholder, value) pairs for a plain-HTTP request to ``host:port``: only the secrets for that host."""
        return tuple((s.placeholder.encode(), s.value.encode()) for s in self.secrets
                     if s.host.matches_name(host, port))

    # ---- decisions --------------------------------------------------------------------------

    def screen(self, attempt: Attempt) -> Verdict | None:
        """Step 1 on the name or literal alone: a refusal, or None (undecided)."""
        address = parse_address(attempt.host)
        rule = _first(self.deny, attempt.host, address, attempt.port)
        if rule is not None:
            return Verdict(False, rule.text, f"denied by --egress-deny {rule.text}")
        return None

    def allows(self, attempt: Attempt) -> Verdict:
        """Step 3: whether some rule (of the operator's, and of each narrowing) allows the attempt."""
        address = parse_address(attempt.host)
        rule = _first(self.allow, attempt.host, address, attempt.port)
        if rule is None:
            return Verdict(False, "not-allowed", "not in --egress-allow")
        for narrowing in self.narrowed_by:
            if _first(narrowing, attempt.host, address, attempt.port) is None:
                return Verdict(False, "not-allowed", "not in the session's egress allow-list")
        return Verdict(True, rule.text, f"allowed by --egress-allow {rule.text}")

    def check_addresses(self, attempt: Attempt, addresses: Sequence[IPAddress]) -> Verdict | None:
        """Steps 1 and 4 on every address: a refusal naming the first bad one, or None."""
        for address in addresses:
            rule = _first(self.deny, "", address, attempt.port)
            shown = f"{attempt.host} resolves to {address}" if str(address) != attempt.host else str(address)
            if rule is not None:
                return Verdict(False, rule.text, f"{shown}, denied by --egress-deny {rule.text}")
            kind = special_kind(address, self.own)
            if kind is None:
                continue
            opened = _first(self.allow, "", address, attempt.port) is not None and all(
                _first(n, "", address, attempt.port) is not None for n in self.narrowed_by)
            if not opened:
                what = "an address of this host" if kind == OWN else f"a {kind} address"
                return Verdict(False, "private-address",
                               f"{shown}, {what} (only an --egress-allow address rule such as "
                               f"{address}/{address.max_prefixlen} opens it)")
        return None
