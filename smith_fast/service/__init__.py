"""The Smith service: one core, sessions over stdio, Unix sockets and TCP (see ``server``)."""
