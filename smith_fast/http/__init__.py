"""HTTP/1.1 for the service's fronts: one server (:mod:`.server`) with a table of routes (the MCP
front's ``/mcp``, ``/metrics``), its request heads read by llhttp with stricter checks on top
(:mod:`.head`)."""
