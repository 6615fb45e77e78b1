"""The start-up and shutdown every aiohttp service here shares (environment, sandbox, reward, search).

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
import sys
from typing import AsyncContextManager, AsyncIterator, Callable, Optional

from aiohttp import web

from verl_agentic.interfaces import ConfigError


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


__all__ = ["run_service", "run_until_signalled", "serve_app"]
