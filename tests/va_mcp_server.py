"""A real MCP server for the tests, written with the official SDK's server API (``mcp.server.mcpserver``).

    python va_mcp_server.py stdio EVENTS_FILE          # over stdin/stdout
    python va_mcp_server.py http PORT EVENTS_FILE      # streamable HTTP on 127.0.0.1:PORT/mcp

Its tools answer from this process (``pid``) so a test sees which server process answered; each start
and each call is a JSON line in EVENTS_FILE ("-": none), so a test sees which process listed and called.
Tools are prefixed by transport (``stdio_*`` / ``http_*``) so both servers fit in one run.
"""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.mcpserver import Image, MCPServer


def main() -> None:
    transport = sys.argv[1]
    events_file = sys.argv[-1]
    prefix = "stdio" if transport == "stdio" else "http"
    app = MCPServer(f"va-{prefix}", log_level="WARNING")

    def event(*what) -> None:
        if events_file != "-":
            with open(events_file, "a") as f:
                f.write(json.dumps([os.getpid(), *what]) + "\n")

    @app.tool(name=f"{prefix}_lookup")
    def lookup(key: str) -> str:
        """Look a key up in the server's table.

        Args:
            key: the key to look up
        """
        event("call", "lookup", key)
        if key == "boom":
            raise ValueError("the table is locked")
        return f"{prefix}:{key}={len(key)}"

    @app.tool(name=f"{prefix}_add")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        event("call", "add", [a, b])
        return a + b

    @app.tool(name=f"{prefix}_pid")
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @app.tool(name=f"{prefix}_sleep")
    def sleep(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "slept"

    @app.tool(name=f"{prefix}_crash")
    def crash() -> str:
        """End the server process at once."""
        event("crash")
        os._exit(3)

    @app.tool(name=f"{prefix}_picture")
    def picture() -> Image:
        """A one-pixel picture."""
        return Image(data=b"\x89PNG\r\n\x1a\n", format="png")

    @app.tool(name=f"{prefix}_probe")
    def probe(path: str, port: int) -> str:
        """What this process is and can see: its uid, whether ``path`` exists, whether 127.0.0.1:``port`` answers."""
        import socket

        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            net = "connected"
        except OSError as e:
            net = type(e).__name__
        return json.dumps({"uid": os.getuid(), "exists": os.path.exists(path), "net": net})

    event("start", transport)
    if transport == "stdio":
        app.run("stdio")
    else:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
