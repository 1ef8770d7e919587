"""The bare-loop floor: the least a server can do to answer a small tool call.

A blocking stdlib loop on stdio: read one JSON-RPC line, open the file it names, write one JSON
answer, flush. No validation, no path check, no concurrency, no limits: a floor to measure the
service against, not a competitor (it would read any file on the machine). It answers the MCP
``tools/call`` shape the report's stdio driver sends, so the driver's cost is the same as for the
MCP contenders. Run: ``python bench/report/floor_server.py ROOT``.
"""

import json
import os
import sys


def main(root: str) -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "id" not in message:
            continue
        try:
            with open(os.path.join(root, message["params"]["arguments"]["path"]), "rb") as f:
                result = {"content": [{"type": "text", "text": f.read().decode()}], "isError": False}
        except (OSError, KeyError, TypeError) as exc:
            result = {"content": [{"type": "text", "text": str(exc)}], "isError": True}
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
