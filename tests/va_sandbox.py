"""``python -m verl_agentic.sandbox.server`` as a real subprocess, for the sandbox and swedev tests."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PREFIX = "sandbox server listening on "


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, so an interrupted run leaves no server."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class SandboxServerProcess:
    """The service in its own process group; ``port=0`` picks a free port (``self.port`` after start)."""

    def __init__(self, *args: str, port: int = 0, workdir_parent: str | None = None):
        self.args = list(args)
        self.workdir_parent = workdir_parent
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.start()

    def start(self) -> None:
        argv = [sys.executable, "-m", "verl_agentic.sandbox.server", "--port", str(self.port), "--quiet", *self.args]
        if self.workdir_parent:
            argv += ["--workdir-parent", self.workdir_parent]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        line = box[0] if box else ""
        if not line.startswith(PREFIX):
            self.kill()
            raise RuntimeError(f"the sandbox server did not start: {line!r}; stderr: {self.proc.stderr.read()[-2000:]}")
        self.url = line[len(PREFIX):].strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL the server's process group (a crash)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def restart(self) -> None:
        """Crash it, then start a new one on the same port (what a supervisor would do)."""
        self.kill()
        deadline = time.monotonic() + 10
        while True:
            try:
                self.start()
                return
            except RuntimeError:  # the port may take a moment to be free again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json()
