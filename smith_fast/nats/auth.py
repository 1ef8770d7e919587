"""PROVISIONAL stub (the real module comes from the natsauth branch)."""

from __future__ import annotations

import argparse
from typing import Any

from ..logs import get_logger

log = get_logger("smith_fast.nats")


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-nkey", metavar="FILE")
    parser.add_argument("--nats-creds", metavar="FILE")


def connect_options(args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if getattr(args, "nats_nkey", None):
        out["nkeys_seed"] = args.nats_nkey
    if getattr(args, "nats_creds", None):
        out["user_credentials"] = args.nats_creds
    return out


def warn_without_credentials(servers: Any, role: str) -> None:
    log.warning("NATS without credentials")
