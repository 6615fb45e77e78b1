"""The start-up and shutdown every aiohttp service here shares (environment, sandbox, reward, search).

``serve_app`` runs an app in the current event loop and yields its URL (the real port when
``port=0``); ``run_until_signalled`` is what each service's ``python -m ...`` does with it: print
the ready line that scripts and tests wait for, serve until SIGTERM/SIGINT, leave the ``async with``
(so the app's own shutdown hooks run), then print the stop line.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import AsyncContextManager, AsyncIterator, Callable, Optional

from aiohttp import web


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


__all__ = ["run_until_signalled", "serve_app"]
