"""The one service toolkit: the error shape both ends share (``errors``), the server half
(``server``: start-up, shutdown, error middleware, JSON bodies) and the client half (``client``:
one HTTP transport with retries, one helper-thread event loop)."""

from verl_agentic.serving.client import BackgroundLoop, HttpTransport
from verl_agentic.serving.errors import ServiceError, body_excerpt, error_from_answer
from verl_agentic.serving.server import (
    error_middleware,
    read_json_object,
    run_service,
    run_until_signalled,
    serve_app,
)

__all__ = ["BackgroundLoop", "HttpTransport", "ServiceError", "body_excerpt", "error_from_answer",
           "error_middleware", "read_json_object", "run_service", "run_until_signalled", "serve_app"]
