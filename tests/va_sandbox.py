"""``python -m verl_agentic.sandbox.server`` as a real subprocess, for the sandbox and swedev tests."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from va_services import ServiceProcess


class SandboxServerProcess(ServiceProcess):
    """The service in its own process group; ``port=0`` picks a free port (``self.port`` after start)."""

    def __init__(self, *args: str, port: int = 0, workdir_parent: str | None = None):
        extra = ["--workdir-parent", workdir_parent] if workdir_parent else []
        super().__init__("verl_agentic.sandbox.server", "--quiet", *args, *extra,
                         ready="sandbox server listening on ", port=port)


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process of this machine."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
