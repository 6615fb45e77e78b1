"""Tools from MCP servers (the Model Context Protocol), through the official ``mcp`` SDK.

A tools entry (``task.tool_agent.tools``; ``tools/registry.py``) names one server, started as a
command over stdio or reached by URL (streamable HTTP)::

    tools:
      - mcp:
          command: [python, -m, my_server]        # stdio: the server is started by this process
          env: {API_KEY: "..."}                   #   added to the SDK's minimal environment
          cwd: /path/to/dir
          isolation: none                         #   none (default) | bwrap; with bwrap: network,
                                                  #   readonly_paths, workdir, tmp_mb (below)
      - mcp:
          url: http://127.0.0.1:8000/mcp          # streamable HTTP: the server runs elsewhere
                                                  #   (no headers / auth yet)
          tools: [search]                         # optional (both): offer only these of its tools
          startup_timeout_s: 30                   # optional (both): to start and list the tools

What happens, in order::

    load_tools(...)          # the config is read: the server is started (stdio) or reached (HTTP) and
                             # its tools listed ONCE per process; each becomes an MCPTool with the
                             # server's name, description and input schema. A server that does not
                             # start is a ConfigError naming the entry, before any model loads.
    tool.execute(...)        # per call, from any episode's event loop: tools/call on the shared
                             # session, under the ToolRunner's call_timeout_s (a timeout cancels the request)
    server dies              # the call in flight gets a typed tool error (status "error", counted in
                             # tool_error) and the session is dropped; the next call starts it again

One session per server per process, shared by all the episodes of that process: it lives on its own
thread with its own event loop (``MCPSession``), so episodes on any loop (``main_rollout``'s, verl's
agent-loop workers') call through it, and a cancelled call (a timeout) cancels its request there.
Inside verl's trainer each agent-loop worker process has its own session (a stdio server per worker).

Isolation: an MCP server is the user's program, like a verl ``BaseTool`` or a function tool, which run
inside the rollout process; by default a stdio server runs as this process's user, with the SDK's minimal
environment. ``isolation: bwrap`` runs it in the same bubblewrap sandbox as the ``python`` tool
(``verl_agentic.isolation``): its own PID, mount, user and (``network: false``, the default) network
namespaces; a read-only root of the system dirs, the interpreter and ``readonly_paths`` (the server's
own files must be listed there), and ``workdir`` (default: a fresh temporary dir) the one writable host
path. What does not hold for a server, unlike a ``python`` call: it lives for the whole run, so the
episodes of a process share its state, and no wall, CPU or memory limit applies to it.

A tool's result: its text content joined; ``isError`` -> status ``error``; image or audio content is an
error of that call (every model here is text-only).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.isolation import bwrap
from verl_agentic.tools.base import BaseTool, ToolResult

logger = logging.getLogger(__name__)

MCP_INSTALL_HINT = "pip install 'mcp==2.3.0' (the official MCP SDK; `make setup` installs it)"


@dataclass(frozen=True)
class MCPServerSpec:
    """One ``mcp:`` entry, validated: a stdio ``command`` or a streamable-HTTP ``url``."""

    where: str  # the entry, for errors: "tools.yaml: tools[2]"
    command: tuple = ()
    url: Optional[str] = None
    env: tuple = ()  # ((key, value), ...)
    cwd: Optional[str] = None
    tools: Optional[tuple] = None
    startup_timeout_s: float = 30.0
    isolation: str = "none"
    network: bool = False
    readonly_paths: tuple = ()
    workdir: Optional[str] = None
    tmp_mb: Optional[int] = 64

    STDIO_KEYS = ("command", "env", "cwd", "isolation", "network", "readonly_paths", "workdir", "tmp_mb")
    HTTP_KEYS = ("url",)
    COMMON_KEYS = ("tools", "startup_timeout_s")

    @classmethod
    def from_entry(cls, d: Any, where: str) -> "MCPServerSpec":
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: 'mcp' must be a mapping with 'command' (stdio) or 'url' (streamable HTTP), "
                              f"got {type(d).__name__}")
        if ("command" in d) == ("url" in d):
            raise ConfigError(f"{where}: 'mcp' needs exactly one of 'command' (a server started over stdio) or "
                              "'url' (a server reached over streamable HTTP)")
        allowed = cls.COMMON_KEYS + (cls.STDIO_KEYS if "command" in d else cls.HTTP_KEYS)
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ConfigError(f"{where}: unknown mcp keys {unknown}; allowed with "
                              f"{'command' if 'command' in d else 'url'}: {sorted(allowed)}")
        command = d.get("command", ())
        command = tuple(command.split()) if isinstance(command, str) else tuple(command or ())
        if "command" in d and (not command or not all(isinstance(c, str) and c for c in command)):
            raise ConfigError(f"{where}: mcp.command must be a non-empty list of strings, got {d['command']!r}")
        url = d.get("url")
        if "url" in d and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise ConfigError(f"{where}: mcp.url must be an http(s) URL such as http://127.0.0.1:8000/mcp, got {url!r}")
        tools = d.get("tools")
        if tools is not None and (isinstance(tools, str) or not all(isinstance(t, str) for t in tools)):
            raise ConfigError(f"{where}: mcp.tools must be a list of tool names, got {tools!r}")
        isolation = d.get("isolation", "none")
        if isolation not in ("none", "bwrap"):
            raise ConfigError(f"{where}: mcp.isolation must be 'none' or 'bwrap', got {isolation!r}")
        paths = d.get("readonly_paths") or ()
        if isinstance(paths, str) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
            raise ConfigError(f"{where}: mcp.readonly_paths must be a list of absolute paths, got {paths!r}")
        timeout = d.get("startup_timeout_s", 30.0)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"{where}: mcp.startup_timeout_s must be a positive number, got {timeout!r}")
        return cls(where=where, command=command, url=url, env=tuple(sorted((d.get("env") or {}).items())),
                   cwd=d.get("cwd"),
                   tools=None if tools is None else tuple(tools), startup_timeout_s=float(timeout),
                   isolation=isolation, network=bool(d.get("network", False)), readonly_paths=tuple(paths),
                   workdir=d.get("workdir"), tmp_mb=d.get("tmp_mb", 64))

    @property
    def label(self) -> str:
        return self.url or " ".join(self.command)

    def key(self) -> str:
        """The identity of the server: one session per key per process."""
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if k != "where"}, sort_keys=True)


def _import_mcp(where: str):
    try:
        import mcp  # the official SDK (imported only where an entry names a server)
    except ImportError as e:
        raise ConfigError(f"{where}: an 'mcp' tools entry needs the mcp package ({e}); fix: {MCP_INSTALL_HINT}") from None
    return mcp


class MCPSession:
    """One server's client session, on its own thread and event loop, shared by a process's episodes.

    ``list_tools()`` (sync) connects and lists; ``await call(...)`` (any loop) calls a tool. A dead
    connection is dropped at the failed call and made again by the next one (``starts`` counts them).
    """

    def __init__(self, spec: MCPServerSpec):
        self.spec = spec
        self.mcp = _import_mcp(spec.where)
        self.starts = 0
        self._client = None  # connected mcp.Client; touched only on self._loop
        self._connecting: Optional[asyncio.Future] = None
        self._end: Optional[asyncio.Event] = None  # set: the current session task leaves its `async with`
        self._stderr = None  # the current stdio server's stderr: an unlinked temporary file
        self._workdirs: list[str] = []  # bwrap work dirs made here (removed at close)
        self._holds: set = set()  # the session tasks (each ends by leaving its client's `async with`)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp:{spec.label[:40]}", daemon=True)
        self._thread.start()

    # ---- the caller's side (any thread / loop) ----
    def list_tools(self) -> list:
        """The server's tools (connecting first); ConfigError naming the entry when it cannot start."""
        fut = asyncio.run_coroutine_threadsafe(self._tools(), self._loop)
        try:
            return fut.result(self.spec.startup_timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ConfigError(self._start_error(f"no answer within startup_timeout_s={self.spec.startup_timeout_s}"))
        except Exception as e:
            raise ConfigError(self._start_error(_describe(e))) from None

    async def call(self, name: str, arguments: dict) -> Any:
        """tools/call on the shared session; cancelling the awaiting task cancels the request (the time limit
        is the caller's: the ToolRunner's ``call_timeout_s`` cancels it)."""
        fut = asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        except Exception as e:  # at exit: say it, do not raise
            logger.warning("MCP server %s: closing the session failed: %s", self.spec.label, _describe(e))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        for d in self._workdirs:
            shutil.rmtree(d, ignore_errors=True)
        if self._stderr is not None:
            self._stderr.close()

    # ---- the session's loop ----
    async def _tools(self) -> list:
        client = await self._connected()
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def _connected(self):
        if self._client is not None:
            return self._client
        if self._connecting is None:
            self._connecting = self._loop.create_future()
            task = self._loop.create_task(self._hold(self._connecting))
            self._holds.add(task)
            task.add_done_callback(self._holds.discard)
        return await asyncio.shield(self._connecting)

    async def _hold(self, ready: asyncio.Future) -> None:
        """Enter the client, publish it, and stay inside its ``async with`` until it is dropped."""
        end = asyncio.Event()
        try:
            async with self.mcp.Client(self._transport()) as client:
                self._client, self._end = client, end
                self._connecting = None  # connected: the next drop starts a new connection
                self.starts += 1
                if self.starts > 1:
                    logger.warning("MCP server %s: session started again (start %d)", self.spec.label, self.starts)
                ready.set_result(client)
                await end.wait()
        except BaseException as e:  # a connection that fails, or breaks later (the SDK's task group raises)
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else ConnectionError(_describe(e)))
            elif not end.is_set():
                logger.warning("MCP server %s: the session ended: %s%s", self.spec.label, _describe(e),
                               self._stderr_tail())
            if not isinstance(e, Exception):
                raise
        finally:
            self._drop(end)
            if self._connecting is ready:  # a connection that failed: the next call tries again
                self._connecting = None

    def _drop(self, end: Optional[asyncio.Event]) -> None:
        """Forget the session that ``end`` belongs to (if it is still the current one) and end it."""
        if end is not None and self._end is end:
            self._client, self._end = None, None
        if end is not None:
            end.set()

    async def _call(self, name: str, arguments: dict) -> Any:
        again = "it is started again at the next call" if self.spec.command else "the next call connects again"
        try:
            client = await self._connected()
        except Exception as e:  # not started / not reachable now
            raise ServerGone(f"MCP server {self.spec.label} is not reachable ({_describe(e)}); {again}") from None
        end = self._end
        try:
            return await client.call_tool(name, arguments)
        except self.mcp.MCPError as e:
            if e.code != _connection_closed():
                raise
            self._drop(end)
            raise ServerGone(f"MCP server {self.spec.label} closed the connection; {again}") from None
        except (asyncio.CancelledError, TimeoutError):
            if self._end is not end:  # the session broke under the call (HTTP: the SDK cancels its scope)
                raise ServerGone(f"MCP server {self.spec.label} broke the session during the call; {again}") from None
            raise
        except Exception as e:  # a transport error: a dead HTTP server
            self._drop(end)
            raise ServerGone(f"MCP server {self.spec.label}: {_describe(e)}; {again}") from None

    async def _shutdown(self) -> None:
        """End the session and wait (5 s at most) until it has left its client (a stdio server is ended)."""
        self._drop(self._end)
        if self._holds:
            await asyncio.wait(set(self._holds), timeout=5)

    def _transport(self):
        """The SDK's transport for the spec: ``stdio_client`` (stderr to a file) or ``streamable_http_client``."""
        if self.spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.spec.url)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        argv = self._isolated() + list(self.spec.command)
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile("w+", prefix="va_mcp_stderr_")  # its tail goes into errors
        logger.info("MCP server %s: starting", self.spec.label)
        return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=dict(self.spec.env) or None,
                                                  cwd=self.spec.cwd), errlog=self._stderr)

    def _isolated(self) -> list[str]:
        """The bubblewrap prefix of the stdio server's command line (empty for ``isolation: none``)."""
        if self.spec.isolation != "bwrap":
            return []
        workdir = self.spec.workdir
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="va_mcp_work_")
            self._workdirs.append(workdir)
        readonly = bwrap.interpreter_paths(sys.executable) + list(self.spec.readonly_paths)
        command = shutil.which(self.spec.command[0])
        if command:
            readonly.append(str(Path(command).resolve().parent))
        return bwrap.bwrap_argv(bwrap.require_bwrap(), workdir, readonly, network=self.spec.network,
                                tmp_bytes=None if self.spec.tmp_mb is None else self.spec.tmp_mb * 2**20)

    def _stderr_tail(self) -> str:
        """The last lines the stdio server wrote to its stderr, as an error's ending ("" without any)."""
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        lines = self._stderr.read().strip().splitlines()[-8:]
        self._stderr.seek(0, 2)
        return ("; its stderr ends:\n  " + "\n  ".join(lines)) if lines else ""

    def _start_error(self, why: str) -> str:
        fix = ("check that the URL is right and the server is up" if self.spec.url else
               "check that the command starts an MCP server on stdio (run it by hand; it should wait for input)")
        return f"{self.spec.where}: MCP server '{self.spec.label}' did not start: {why}; fix: {fix}{self._stderr_tail()}"


class ServerGone(ConnectionError):
    """The MCP server's session broke during a call (the call's episode gets a tool error)."""


def _connection_closed() -> int:
    from mcp_types import CONNECTION_CLOSED

    return CONNECTION_CLOSED


def _describe(e: BaseException) -> str:
    """One line for an exception, an ExceptionGroup's first leaf included."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


class MCPTool(BaseTool):
    """One tool of an MCP server; its calls go through the process's shared ``MCPSession``."""

    def __init__(self, session: MCPSession, tool: Any):
        self.session = session
        schema = dict(tool.input_schema or {"type": "object", "properties": {}})
        schema.pop("title", None)
        super().__init__({}, {"type": "function", "function": {
            "name": tool.name, "description": tool.description or tool.name, "parameters": schema}})
        self.source = f"{session.spec.where} (mcp server {session.spec.label}, tool {tool.name})"

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        try:
            result = await self.session.call(self.name, parameters)
        except ServerGone as e:
            return ToolResult(f"Error: {e}", status="error")
        return mcp_result(self.name, result)


def mcp_result(name: str, result: Any) -> ToolResult:
    """An MCP ``CallToolResult`` as a ``ToolResult``: text joined; isError -> error; media -> error."""
    texts, media = [], []
    for block in result.content or []:
        kind = getattr(block, "type", type(block).__name__)
        if kind == "text":
            texts.append(block.text)
        elif kind == "resource" and hasattr(getattr(block, "resource", None), "text"):
            texts.append(block.resource.text)
        else:
            media.append(kind)
    if media:
        return ToolResult(f"Error: MCP tool {name!r} returned {', '.join(sorted(set(media)))} content, but the model "
                          "is text-only; return text from this tool", status="error")
    text = "\n".join(texts)
    if not texts and getattr(result, "structured_content", None) is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return ToolResult(text, status="error" if result.is_error else "ok")


_SESSIONS: dict[str, MCPSession] = {}
_SESSIONS_LOCK = threading.Lock()


def session_for(spec: MCPServerSpec) -> MCPSession:
    """The process's session for ``spec``'s server (made on first use)."""
    with _SESSIONS_LOCK:
        if spec.key() not in _SESSIONS:
            _SESSIONS[spec.key()] = MCPSession(spec)
        return _SESSIONS[spec.key()]


@atexit.register
def close_sessions() -> None:
    """End every session (stdio servers exit when their stdin closes)."""
    with _SESSIONS_LOCK:
        sessions = list(_SESSIONS.values())
        _SESSIONS.clear()
    for s in sessions:
        s.close()


def load_mcp_tools(entry: Any, where: str) -> list[MCPTool]:
    """The tools of the server an ``mcp:`` entry names, listed once per process."""
    spec = MCPServerSpec.from_entry(entry, where)
    session = session_for(spec)
    listed = session.list_tools()
    names = [t.name for t in listed]
    missing = sorted(set(spec.tools or ()) - set(names))
    if missing:
        raise ConfigError(f"{where}: mcp.tools names {missing}, which MCP server '{spec.label}' does not offer; "
                          f"it offers {sorted(names)}")
    return [MCPTool(session, t) for t in listed if spec.tools is None or t.name in spec.tools]
