"""Real services for the tests (importable as ``va_services``).

- ``ServiceProcess``: one of our ``python -m ...`` servers as a real subprocess, started and stopped
  the way a user or a supervisor would.
- ``LoopbackProxy``: the base of the fault-injecting proxies, a real aiohttp server on loopback in
  front of a real service; a subclass's ``_handle`` answers with a fault or ``forward``s upstream.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import aiohttp
import psutil
from aiohttp import web

from verl_agentic.serving import serve_app

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, so an interrupted run leaves no server."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServiceProcess:
    """``python -m MODULE *ARGS --port PORT`` in its own process group, dying with the test process.

    Started when made: it waits for the service's ready line (``ready`` then the URL) and raises
    ``RuntimeError`` with the service's stderr if none comes. ``port=0`` lets the service pick one;
    ``self.port`` is then the real one, which ``restart`` reuses. stderr goes to a file (a pipe nobody
    reads could fill and block the service); ``stderr_text()`` reads it. The tests' folder is on the
    child's ``PYTHONPATH`` so ``--scorer-module`` / ``--task-module`` can name test modules.
    """

    def __init__(self, module: str, *args: str, ready: str, port: int = 0, start_timeout_s: float = 60.0):
        self.module, self.args, self.ready, self.port = module, list(args), ready, port
        self.start_timeout_s = start_timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="va-service-")
        self.start()

    def start(self) -> None:
        argv = [sys.executable, "-m", self.module, *self.args, "--port", str(self.port)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")]))
        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=REPO,
                                     env=env, start_new_session=True, preexec_fn=_die_with_parent)
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        line = box[0] if box else ""
        if not line.startswith(self.ready):
            self.kill()
            raise RuntimeError(f"{self.module} did not start within {self.start_timeout_s} s: first line {line!r}; "
                               f"stderr: {self.stderr_text()[-3000:]}")
        self.url = line[len(self.ready):].split()[0]
        self.port = int(self.url.rsplit(":", 1)[1])

    def stderr_text(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the service's process group (a crash); children outside the group are left to notice."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def restart(self, deadline_s: float = 10.0) -> None:
        """Crash it, then start a new one on the same port (what a supervisor would do)."""
        self.kill()
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                self.start()
                return
            except RuntimeError:  # the port may take a moment to be free again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` to the service (not its group: shutting its children down is its job); its exit code."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        self._stderr.close()

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LoopbackProxy:
    client_max_size = 256 * 2**20
    shutdown_timeout = 0.5

    def __init__(self, upstream: str):
        self.upstream = upstream
        self._session: Optional[aiohttp.ClientSession] = None
        self._server = None

    async def __aenter__(self) -> str:
        app = web.Application(client_max_size=self.client_max_size)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession()
        self._server = serve_app(app, shutdown_timeout=self.shutdown_timeout)
        return await self._server.__aenter__()

    async def __aexit__(self, *exc) -> None:
        try:
            await self._server.__aexit__(*exc)
        finally:
            await self._session.close()

    async def forward(self, request: web.Request, body: Optional[bytes] = None) -> tuple[int, bytes]:
        """Send ``request`` (with ``body``, else its own) upstream; its status and body."""
        data = await request.read() if body is None else body
        async with self._session.request(request.method, self.upstream + request.path_qs, data=data,
                                         headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.read()

    async def forward_response(self, request: web.Request, body: Optional[bytes] = None) -> web.Response:
        status, data = await self.forward(request, body)
        return web.Response(status=status, body=data, content_type="application/json")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        return await self.forward_response(request)
