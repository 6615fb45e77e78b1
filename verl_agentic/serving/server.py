"""The server half every aiohttp service here shares (environment, sandbox, reward, search).

``error_middleware`` answers every failure in the one error shape (``errors.py``): a
``ServiceError`` as raised, an unknown route or method, a body over the app's size limit, and
any other exception as a retryable 500 ``internal_error`` (the service keeps serving).
``read_json_object`` reads a request body that must be a JSON object, optionally with only known
fields.

``serve_app`` runs an app in the current event loop and yields its URL (the real port when
``port=0``); ``run_until_signalled`` is what each service's ``python -m ...`` does with it: print
the ready line that scripts and tests wait for, serve until SIGTERM/SIGINT, leave the ``async with``
(so the app's own shutdown hooks run), then print the stop line. ``run_service`` is a service's whole
``main()`` after its arguments are parsed: a ``ConfigError`` while building it is exit code 2 with
``<name>: <message>`` on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import json
import sys
from collections import Counter
from typing import AsyncContextManager, AsyncIterator, Callable, Optional, Sequence

from aiohttp import web

from verl_agentic.interfaces import ConfigError
from verl_agentic.serving.errors import ServiceError


def error_middleware(counts: Optional[Counter] = None):
    """The middleware that answers failures as ``ServiceError`` JSON; ``counts`` (if given) gets
    ``http_<status>`` for each."""

    @web.middleware
    async def errors(request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ServiceError as e:
            error = e
        except web.HTTPRequestEntityTooLarge as e:
            error = ServiceError(413, "request_too_large", f"request body too large: {e.text}")
        except web.HTTPException as e:
            if e.status < 400:
                raise
            kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "bad_request")
            error = ServiceError(e.status, kind, f"{request.method} {request.path}: {e.reason}")
        except Exception as e:  # noqa: BLE001 - a bug or an OS error: say so, keep serving
            error = ServiceError(500, "internal_error", f"{type(e).__name__}: {e}", retryable=True)
        if counts is not None:
            counts[f"http_{error.status}"] += 1
        return error.response()

    return errors


async def read_json_object(request: web.Request, known: Optional[Sequence[str]] = None) -> dict:
    """The request's body, which must be a JSON object (with only the ``known`` fields, if given)."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise ServiceError(400, "bad_request", f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ServiceError(400, "bad_request", f"request body must be a JSON object, got {type(body).__name__}")
    unknown = set(body) - set(known) if known is not None else set()
    if unknown:
        raise ServiceError(400, "bad_request", f"unknown fields {sorted(unknown)}; known: {list(known)}")
    return body


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                    shutdown_timeout: float = 2.0, quiet: bool = True) -> AsyncIterator[str]:
    """Serve ``app`` in this event loop; yields ``http://host:port``. ``quiet``: no access log."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, **({"access_log": None} if quiet else {}))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def run_until_signalled(server: AsyncContextManager[str], ready: Callable[[str], str],
                              stopped: Optional[Callable[[], str]] = None) -> None:
    """Enter ``server`` (a ``serve(...)`` context yielding the URL), print ``ready(url)`` to stdout,
    wait for SIGTERM or SIGINT, exit the context, then print ``stopped()`` to stderr."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server as url:
        print(ready(url), flush=True)
        await stop.wait()
    if stopped is not None:
        print(stopped(), file=sys.stderr, flush=True)


def run_service(name: str, start: Callable[[], AsyncContextManager[str]],
                stopped: Optional[Callable[[], str]] = None) -> int:
    """Build the service (``start()``, which may raise ``ConfigError``) and serve it until a signal.

    Prints ``<name> listening on <url>`` when ready (scripts and tests wait for that line) and
    ``stopped()`` (default ``<name> stopped``) at the end; returns the process exit code.
    """
    try:
        asyncio.run(run_until_signalled(start(), lambda url: f"{name} listening on {url}",
                                        stopped or (lambda: f"{name} stopped")))
    except ConfigError as e:
        print(f"{name}: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


__all__ = ["error_middleware", "read_json_object", "run_service", "run_until_signalled", "serve_app"]
