"""The tools of the ``swedev`` task: view / write / edit files, run a command, run the visible tests.

Each acts on one episode's sandbox through its ``SandboxSession``, passed to ``create`` by the
task (``ToolRunner.start({name: {"session": session}})``). Calls of one turn run in the order the
model wrote them: the session's lock is FIFO and the runner starts the calls in order, so a
``write_file`` followed by ``run_tests`` in the same turn tests the written file.

A request the service refuses because of its arguments (a path outside the repository, a missing
file) is an error message to the model. A failure of the sandbox itself (the service is down or
restarted, the sandbox was reaped) is recorded as ``session.fatal``; the task then ends the
episode with a typed error instead of letting the model talk to a sandbox that is gone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.sandbox.client import SandboxClient, SandboxError
from verl_agentic.sandbox.runtime import result_from_dict
from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.isolation import SandboxLimits
from verl_agentic.tools.python_sandbox import format_sandbox_output


@dataclass
class SandboxSession:
    """One episode's sandbox, as its tools see it."""

    client: SandboxClient
    sandbox_id: str
    instance_id: str
    test_command: Optional[str]  # the repository's visible tests (run_tests), if any
    command_timeout_s: float = 10.0
    max_output_chars: int = 4000
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    fatal: Optional[SandboxError] = None  # the first failure of the sandbox itself
    counts: dict = field(default_factory=lambda: {"commands": 0, "test_runs": 0, "files_written": 0})


def _params(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


def _schema(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": _params(props, required)}}


_PATH = {"type": "string", "description": "Path relative to the repository root, e.g. solution.py"}


class SandboxTool(BaseTool):
    """Base: binds ``create(session=...)``; ``run`` executes under the session's lock with typed errors."""

    def session(self, instance_id: str) -> SandboxSession:
        return self._instances[instance_id]

    async def create(self, instance_id: Optional[str] = None, session: Optional[SandboxSession] = None,
                     **kwargs: Any) -> str:
        if session is None:
            raise ValueError(f"{self.name}: create() needs the episode's session=SandboxSession")
        instance_id = await super().create(instance_id)
        self._instances[instance_id] = session
        return instance_id

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        session = self.session(instance_id)
        problem = self._check(parameters)
        if problem:
            return ToolResult(f"Error: {self.name}: {problem}", status="error")
        async with session.lock:
            if session.fatal is not None:
                return ToolResult(f"Error: the sandbox is unavailable ({session.fatal})", status="error")
            try:
                return await self.run(session, parameters)
            except SandboxError as e:
                if e.fatal:
                    session.fatal = session.fatal or e
                    return ToolResult(f"Error: the sandbox is unavailable ({e})", status="error")
                return ToolResult(f"Error: {e.message}", status="error")

    def _check(self, parameters: dict) -> Optional[str]:
        """A message for arguments of the wrong type (the runner already checked that required ones exist)."""
        props = self.tool_schema["function"]["parameters"]["properties"]
        types = {"string": str, "integer": int}
        for name, value in parameters.items():
            if name not in props:
                return f"unknown argument {name!r}; expected {sorted(props)}"
            want = types.get(props[name].get("type"))
            if want is not None and (not isinstance(value, want) or isinstance(value, bool)):
                return f"argument {name!r} must be a {props[name]['type']}, got {type(value).__name__}"
        return None

    async def run(self, session: SandboxSession, parameters: dict) -> ToolResult:
        raise NotImplementedError


class ViewFileTool(SandboxTool):
    DEFAULT_SCHEMA = _schema(
        "view_file", "Show a file of the repository with line numbers, or list a directory ('.' is the root).",
        {"path": _PATH, "start_line": {"type": "integer", "description": "First line to show (1-based)"},
         "end_line": {"type": "integer", "description": "Last line to show"}}, ["path"])

    async def run(self, session: SandboxSession, parameters: dict) -> ToolResult:
        got = await session.client.read_file(session.sandbox_id, parameters["path"])
        if got["type"] == "directory":
            lines = [e["name"] + ("/" if e["type"] == "directory" else "") for e in got["entries"]]
            return ToolResult("\n".join(lines) or "(empty directory)")
        text_lines = got["content"].splitlines()
        start = max(1, int(parameters.get("start_line") or 1))
        end = min(len(text_lines), int(parameters.get("end_line") or len(text_lines)))
        if text_lines and start > end:
            return ToolResult(f"Error: no lines {start}-{end}: {parameters['path']} has {len(text_lines)} lines",
                              status="error")
        shown = "\n".join(f"{n:>4} | {text_lines[n - 1]}" for n in range(start, end + 1))
        notes = []
        if got.get("truncated"):
            notes.append(f"[file truncated: {got['size']} bytes]")
        if got.get("binary"):
            notes.append("[not UTF-8 text: undecodable bytes replaced]")
        if len(shown) > session.max_output_chars:
            shown = shown[:session.max_output_chars] + "\n[... cut: ask for a line range ...]"
        return ToolResult("\n".join([shown or "(empty file)", *notes]))


class WriteFileTool(SandboxTool):
    DEFAULT_SCHEMA = _schema(
        "write_file", "Create or overwrite a file of the repository with the given content.",
        {"path": _PATH, "content": {"type": "string", "description": "The complete new content of the file"}},
        ["path", "content"])

    async def run(self, session: SandboxSession, parameters: dict) -> ToolResult:
        got = await session.client.write_file(session.sandbox_id, parameters["path"], parameters["content"])
        session.counts["files_written"] += 1
        return ToolResult(f"Wrote {got['bytes']} bytes to {parameters['path']}.")


class EditFileTool(SandboxTool):
    DEFAULT_SCHEMA = _schema(
        "edit_file", "Replace one exact occurrence of old_str in a file with new_str.",
        {"path": _PATH, "old_str": {"type": "string", "description": "Text to replace; must occur exactly once"},
         "new_str": {"type": "string", "description": "The replacement text"}}, ["path", "old_str", "new_str"])

    async def run(self, session: SandboxSession, parameters: dict) -> ToolResult:
        path, old, new = parameters["path"], parameters["old_str"], parameters["new_str"]
        got = await session.client.read_file(session.sandbox_id, path)
        if got["type"] != "file" or got.get("truncated") or got.get("binary"):
            return ToolResult(f"Error: {path} is not a text file that edit_file can change", status="error")
        count = got["content"].count(old) if old else 0
        if count != 1:
            why = "old_str is empty" if not old else f"old_str occurs {count} times in {path}"
            return ToolResult(f"Error: {why}; it must occur exactly once (add surrounding lines)", status="error")
        await session.client.write_file(session.sandbox_id, path, got["content"].replace(old, new, 1))
        session.counts["files_written"] += 1
        return ToolResult(f"Edited {path}: replaced 1 occurrence.")


def _command_result(session: SandboxSession, answer: dict, timeout_s: float) -> ToolResult:
    res = result_from_dict(answer)
    text = format_sandbox_output(res, SandboxLimits(wall_timeout_s=timeout_s), session.max_output_chars)
    status = "timeout" if res.timed_out else ("ok" if res.ok else "error")
    return ToolResult(text, metrics={"exit_code": res.exit_code, "error_type": res.error_type,
                                     "duration_s": res.duration_s}, status=status)


class RunCommandTool(SandboxTool):
    DEFAULT_SCHEMA = _schema(
        "run_command", "Run a shell command in the repository root and return its output (no network access; "
        "time and memory are limited).", {"command": {"type": "string", "description": "e.g. python solution.py"}},
        ["command"])

    async def run(self, session: SandboxSession, parameters: dict) -> ToolResult:
        answer = await session.client.exec(session.sandbox_id, parameters["command"], session.command_timeout_s)
        session.counts["commands"] += 1
        return _command_result(session, answer, session.command_timeout_s)


class RunTestsTool(SandboxTool):
    DEFAULT_SCHEMA = _schema("run_tests", "Run the repository's tests and return their output.", {}, [])

    async def run(self, session: SandboxSession, parameters: dict) -> ToolResult:
        if not session.test_command:
            return ToolResult("This repository has no tests to run; check your work with run_command.")
        answer = await session.client.exec(session.sandbox_id, session.test_command, session.command_timeout_s)
        session.counts["test_runs"] += 1
        result = _command_result(session, answer, session.command_timeout_s)
        verdict = "Tests passed." if result.status == "ok" else "Tests failed."
        return ToolResult(f"{verdict}\n{result.text}", metrics=result.metrics, status=result.status)


SANDBOX_TOOLS: dict[str, type] = {cls.DEFAULT_SCHEMA["function"]["name"]: cls for cls in
                                  (ViewFileTool, WriteFileTool, EditFileTool, RunCommandTool, RunTestsTool)}
