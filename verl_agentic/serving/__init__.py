"""The one service toolkit: the error shape both ends share (``errors``), the server half
(``server``: start-up, shutdown, error middleware, JSON bodies) and the client half (``client``:
one HTTP transport with retries, one helper-thread event loop).

The names below are imported on first use (PEP 562): ``serving.errors`` alone does not import
aiohttp, so a process that only needs ``ServiceError`` (a prime scorer worker loading the swedev
task through the scorers' entry points) does not pay for aiohttp's import (~0.2-0.4 s).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BackgroundLoop": "client", "HttpTransport": "client",
    "ServiceError": "errors", "body_excerpt": "errors", "error_from_answer": "errors",
    "error_middleware": "server", "read_json_object": "server", "run_service": "server",
    "run_until_signalled": "server", "serve_app": "server",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'verl_agentic.serving' has no attribute {name!r}")
    return getattr(importlib.import_module(f"verl_agentic.serving.{_WHERE[name]}"), name)


__all__ = sorted(_WHERE)
