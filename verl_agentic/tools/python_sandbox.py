"""The ``python`` tool: model-written Python run in the isolation engine (``verl_agentic.isolation``).

``PythonTool`` (registered as ``python``) gives each episode its own work dir, kept across the
episode's calls (files written by one call are visible to the next, and are the only host files
the code can write) and removed by ``release``. Config keys: the ``SandboxLimits`` fields
(``wall_timeout_s``, ``memory_mb``, ``isolation``, ...), ``max_output_chars`` (what the model
sees, head and tail kept, default 4000), ``max_concurrency`` (sandboxes at once per tool, default
2 x CPUs), ``python_executable``. ``isolation: bwrap`` (the default) needs bubblewrap: without it
the tool refuses to start (``IsolationUnavailable`` says how to install it); ``isolation: none``
runs without it and logs a warning whenever a tool starts.

The engine's names stay importable from here (``SandboxLimits``, ``run_python``, ...) for code
written against earlier versions; new code imports them from ``verl_agentic.isolation``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.isolation import (
    SandboxLimits,
    SandboxResult,
    check_isolation,
    run_python,
    run_python_sync,
    sandbox_support,
    write_files,
)
from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.registry import register_tool_class

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "run_python_sync", "sandbox_support", "PythonTool",
           "format_sandbox_output"]


def _clip(text: str, max_chars: int, keep: str = "both") -> str:
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    if keep == "tail":
        return f"[... {cut} characters omitted ...]\n" + text[-max_chars:]
    head = max_chars * 2 // 3
    return text[:head] + f"\n[... {cut} characters omitted ...]\n" + text[len(text) - (max_chars - head):]


def format_sandbox_output(res: SandboxResult, limits: SandboxLimits, max_chars: int = 4000) -> str:
    """A concise message for the model: stdout, stderr (tail kept), and a status line if not ok."""
    parts = []
    err = res.stderr.strip("\n")
    err_part = _clip(err, max_chars // 2, keep="tail") if err else ""
    out = res.stdout.rstrip("\n")
    if out:
        parts.append(_clip(out, max(200, max_chars - len(err_part))))
    if err_part:
        parts.append("[stderr]\n" + err_part)
    if res.error_type == "timeout":
        parts.append(f"[timed out after {limits.wall_timeout_s:g} s: the program was killed]")
    elif res.error_type == "output_limit":
        parts.append(f"[output exceeded {limits.max_output_bytes} bytes: truncated, the program was killed]")
    elif res.error_type == "sandbox_error":
        parts.append("[the sandbox failed to start the program]")
    elif res.error_type == "cpu_time":
        parts.append(f"[CPU time limit of {limits.cpu_time_s} s exceeded: the program was killed]")
    elif res.killed_by:
        parts.append(f"[killed by {res.killed_by}]")
    elif res.exit_code not in (0, None):
        parts.append(f"[exit code {res.exit_code}]")
    return "\n".join(parts) if parts else "(no output)"


_TOOL_KEYS = {"max_output_chars", "max_concurrency", "python_executable", "type"}


@dataclass
class _Episode:
    workdir: Path
    lock: asyncio.Lock


@register_tool_class("python")
class PythonTool(BaseTool):
    """Runs Python code in the sandbox; one work dir per episode, kept across its calls.

    Config (all optional): ``SandboxLimits`` fields (``wall_timeout_s``, ``cpu_time_s``,
    ``memory_mb``, ``file_size_mb``, ``max_processes``, ``max_output_bytes``, ``network``,
    ``isolation``, ``readonly_paths``, ``tmp_mb``),
    ``max_output_chars`` (default 4000), ``max_concurrency`` (default 2 x CPUs),
    ``python_executable``. ``create(files={...})`` seeds the episode's work dir.
    """

    DEFAULT_SCHEMA = {"type": "function", "function": {
        "name": "python",
        "description": ("Run Python 3 code and return what it prints (stdout, then stderr). Each call is a "
                        "fresh process: variables do not persist, but files written in the current directory "
                        "do. Print the values you need. No network access; time and memory are limited."),
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"]}}}

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        super().__init__(config, tool_schema)
        limit_names = {f.name for f in dataclasses.fields(SandboxLimits)}
        unknown = set(self.config) - limit_names - _TOOL_KEYS
        if unknown:
            raise ConfigError(f"python tool: unknown config keys {sorted(unknown)}; known: "
                              f"{sorted(limit_names | _TOOL_KEYS - {'type'})}")
        self.limits = SandboxLimits.from_dict({k: v for k, v in self.config.items() if k in limit_names})
        check_isolation(self.limits, "python tool")  # refuse to start without it; warn when turned off
        self.max_output_chars = int(self.config.get("max_output_chars", 4000))
        self.max_concurrency = int(self.config.get("max_concurrency") or 2 * (os.cpu_count() or 2))
        self.python_executable = self.config.get("python_executable")
        self._episodes: dict[str, _Episode] = {}
        self._semaphores: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = \
            weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return sem

    def workdir(self, instance_id: str) -> Path:
        """The episode's work dir (for inspection and tests)."""
        return self._episode(instance_id).workdir

    def _episode(self, instance_id: str) -> _Episode:
        try:
            return self._episodes[instance_id]
        except KeyError:
            raise KeyError(f"python tool: unknown instance_id {instance_id!r}: call create() first "
                           f"(or it was released)") from None

    async def create(self, instance_id: Optional[str] = None, files: Optional[dict] = None, **kwargs: Any) -> str:
        instance_id = await super().create(instance_id, **kwargs)
        wd = Path(tempfile.mkdtemp(prefix="va_python_tool_"))
        if files:
            write_files(wd, files)
        self._episodes[instance_id] = _Episode(wd, asyncio.Lock())
        return instance_id

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        ep = self._episode(instance_id)
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str):
            return ToolResult("Error: python() needs a 'code' argument: a string of Python source.", status="error")
        async with ep.lock, self._semaphore():  # one call at a time per episode (shared dir)
            res = await run_python(code, limits=self.limits, workdir=ep.workdir,
                                   python_executable=self.python_executable)
        status = "timeout" if res.timed_out else ("ok" if res.ok else "error")
        metrics = {"duration_s": res.duration_s, "exit_code": res.exit_code, "truncated": res.truncated,
                   "timed_out": res.timed_out, "error_type": res.error_type}
        return ToolResult(format_sandbox_output(res, self.limits, self.max_output_chars), 0.0, metrics, status)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        ep = self._episodes.pop(instance_id, None)
        if ep is not None:
            shutil.rmtree(ep.workdir, ignore_errors=True)
        await super().release(instance_id, **kwargs)
