"""The MCP (Model Context Protocol) front: ``serve --mcp`` (stdio) and ``serve --mcp-http``
(Streamable HTTP), on the same service core as the Smith fronts (ARCHITECTURE.md, "Where a change goes")."""
