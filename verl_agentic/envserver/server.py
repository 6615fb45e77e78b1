"""The environment service: any registered task's start / obs / end behind HTTP.

Protocol (JSON in and out; errors are ``{"error": {"type", "message", "retryable"}}``):

- ``POST /start`` ``{"task_type", "row", "session_id"?, "task_config"?, "sample_index"?, "max_turns"?,
  "seed"?}`` -> ``{"session_id", "messages", "tools"}``: runs the task's ``start``. A client-chosen
  ``session_id`` makes the call idempotent: repeating it returns the same answer.
- ``POST /step`` ``{"session_id", "turn", "message", "finish_reason"?}`` -> ``{"messages", "done",
  "turn_reward", "metrics", "info"}``: ``message`` is assistant turn ``turn`` (1, 2, ...; OpenAI form,
  ``tool_calls`` allowed); runs the task's ``obs``. Repeating the last turn returns the cached
  answer (a retried request never runs ``obs`` twice; a repeat that arrives while the first is
  running waits for it); any other turn number is a 409.
- ``POST /end`` ``{"session_id", "finish_reason"?, "error"?}`` -> ``{"reward", "metrics"}``: runs the
  task's ``end`` and closes the session; repeating it returns the same answer.
- ``GET /health`` -> ``{"status": "ok", "tasks", "sessions", "stats"}``.

Error types and statuses: ``bad_request`` 400 (not JSON, missing or mistyped fields, a config
the task rejects), ``unknown_task`` 404 (lists the registered ones), ``unknown_session`` 404
(never started, ended, or reaped: the message says which), ``out_of_order`` 409,
``too_many_sessions`` 429, the task's own error type (``task_error``, ``end_error``, or the
type of an ``EpisodeFailure`` it raised) 500, ``timeout`` 504 when a task function ran past
``hook_timeout_s``. Only a 503 (``shutting_down``) is marked retryable: the others come from the
task or the request, and repeating them gives the same answer.

How the task sees an assistant turn: the environment side works on messages, not tokens. Its
``EpisodeState`` gets the assistant message with the tool calls written back into the text in
the format of the task config's ``parser`` (default ``hermes``), which is what the task's own
parser reads (``GenOutput`` has that text, no token ids). Tool messages the task answers get
the ``tool_call_id`` of the call they answer, in order, when the counts match.

Sessions idle for ``session_ttl_s`` are reaped: ``end`` runs (with a ``timeout`` error on the
state, so tools and sandboxes are released) and later requests get ``unknown_session`` saying
so. On shutdown every live session is ended the same way. Sync task functions run in a worker
thread, so a slow one does not stall other sessions.

The service trusts its clients (a request may carry the task's config, and tools configs name
classes to import): bind it to loopback (the default) or a private network.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from aiohttp import web

from verl_agentic.backends.chat_adapter import calls_from_message
from verl_agentic.interfaces import (
    ConfigError,
    EpisodeError,
    EpisodeFailure,
    EpisodeResult,
    EpisodeState,
    GenOutput,
    Observation,
    RolloutContext,
)
from verl_agentic.serving import ServiceError, error_middleware, read_json_object, serve_app
from verl_agentic.tasks import TASKS
from verl_agentic.tools.parsers import get_parser

DEFAULT_SESSION_TTL_S = 600.0
DEFAULT_HOOK_TIMEOUT_S = 300.0
DEFAULT_MAX_SESSIONS = 10_000
ENDED_MEMORY = 10_000  # ended sessions whose /end answer (or reaping) is remembered


def _task_failure(where: str, e: BaseException) -> ServiceError:
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, EpisodeFailure):
        return ServiceError(500, e.type, f"{where}: {e.message}")
    return ServiceError(500, "end_error" if where == "end" else "task_error", f"{where}: {type(e).__name__}: {e}")


def assistant_text(message: dict, parser_name: str) -> str:
    """An OpenAI-form assistant message as text the task's parser reads (tool calls written back)."""
    content = message.get("content") or ""
    calls = calls_from_message(message)
    if not calls:
        return content
    return get_parser(parser_name).format_calls(calls, content)


@dataclass
class _Session:
    id: str
    task_type: str
    spec: Any
    state: EpisodeState
    parser: str
    start_answer: dict
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    turn: int = 0  # the last assistant turn stepped
    step_answer: Optional[tuple[int, Any]] = None  # (turn, answer dict or ServiceError)
    busy: int = 0


class EnvService:
    """Sessions of registered tasks; the aiohttp handlers call into this."""

    def __init__(self, *, task_configs: Optional[dict] = None, tokenizer: Any = None,
                 session_ttl_s: float = DEFAULT_SESSION_TTL_S, hook_timeout_s: Optional[float] = DEFAULT_HOOK_TIMEOUT_S,
                 max_sessions: int = DEFAULT_MAX_SESSIONS):
        self.task_configs = dict(task_configs or {})
        self.tokenizer = tokenizer
        self.session_ttl_s = session_ttl_s
        self.hook_timeout_s = hook_timeout_s
        self.max_sessions = max_sessions
        self.sessions: dict[str, _Session] = {}
        # ended session id -> its /end answer (dict or ServiceError), "reaped" or "shutdown"
        self.ended: OrderedDict[str, Any] = OrderedDict()
        self._starting: dict[str, asyncio.Task] = {}
        self._checked_configs: set[str] = set()
        self.counts: Counter = Counter()
        self.closing = False

    # -- task calls --------------------------------------------------------------------------------
    async def _call(self, fn: Any, *args: Any) -> Any:
        """A task function under the hook timeout; sync ones in a worker thread."""
        async def run() -> Any:
            if inspect.iscoroutinefunction(fn):
                return await fn(*args)
            value = await asyncio.to_thread(fn, *args)
            return await value if inspect.isawaitable(value) else value

        try:
            async with asyncio.timeout(self.hook_timeout_s if self.hook_timeout_s and self.hook_timeout_s > 0 else None):
                return await run()
        except TimeoutError:
            name = getattr(fn, "__name__", "task function")
            raise ServiceError(504, "timeout", f"{name} ran past the service's hook timeout of "
                                               f"{self.hook_timeout_s} s") from None

    async def _hook(self, name: str, counter: str, fn: Any, returns: type, *args: Any) -> Any:
        """Run the task's ``name`` hook and check the type it returns. Any failure (a raise, a
        wrong type, the hook timeout) is counted in ``counts[counter]`` and raised as the
        ``ServiceError`` the client gets."""
        try:
            value = await self._call(fn, *args)
            if not isinstance(value, returns):
                raise TypeError(f"{name}() must return an {returns.__name__}, got {type(value).__name__}")
            return value
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self.counts[counter] += 1
            raise _task_failure(name, e) from None

    def _config(self, task_type: str, spec: Any, requested: Any) -> dict:
        if requested is not None and not isinstance(requested, dict):
            raise ServiceError(400, "bad_request", f"'task_config' must be an object, got {type(requested).__name__}")
        cfg = {**self.task_configs.get(task_type, {}), **(requested or {})}
        key = json.dumps([task_type, cfg], sort_keys=True, default=str)
        if key not in self._checked_configs and spec.check_config is not None:
            try:
                spec.check_config(dict(cfg))
            except ConfigError as e:
                raise ServiceError(400, "bad_request", f"task.{task_type} config: {e}") from None
            self._checked_configs.add(key)
        return cfg

    # -- endpoints ---------------------------------------------------------------------------------
    async def start(self, body: dict) -> dict:
        task_type, row = body.get("task_type"), body.get("row")
        if not isinstance(task_type, str) or not isinstance(row, dict):
            raise ServiceError(400, "bad_request", "/start needs 'task_type' (a string) and 'row' (an object)")
        session_id = body.get("session_id") or uuid.uuid4().hex
        if not isinstance(session_id, str):
            raise ServiceError(400, "bad_request", "'session_id' must be a string")
        if session_id in self.sessions:
            return self.sessions[session_id].start_answer
        if session_id in self.ended:
            raise ServiceError(409, "out_of_order", f"session {session_id!r} has already ended")
        if session_id in self._starting:  # a retry of a start still running: its answer
            return await asyncio.shield(self._starting[session_id])
        if self.closing:
            raise ServiceError(503, "shutting_down", "the environment service is shutting down", retryable=True)
        if len(self.sessions) + len(self._starting) >= self.max_sessions:
            raise ServiceError(429, "too_many_sessions", f"{len(self.sessions)} live sessions, the service's limit "
                                                         f"is {self.max_sessions}; end sessions or raise --max-sessions")
        if task_type not in TASKS:
            raise ServiceError(404, "unknown_task", f"unknown task_type {task_type!r}; registered: "
                                                    f"{', '.join(TASKS.names())}")
        spec = TASKS.get(task_type)
        cfg = self._config(task_type, spec, body.get("task_config"))
        ints = {k: body.get(k, d) for k, d in (("sample_index", 0), ("max_turns", 1), ("seed", None))}
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in ints.values()):
            raise ServiceError(400, "bad_request", f"'sample_index', 'max_turns' and 'seed' must be integers, got {ints}")
        ctx = RolloutContext(tokenizer=self.tokenizer, task_config=cfg, sample_index=ints["sample_index"] or 0,
                             max_turns=ints["max_turns"] or 1, seed=ints["seed"])
        # its own task: a client that gives up (and retries) does not cancel the task's start
        task = asyncio.ensure_future(self._start(session_id, task_type, spec, {**row, "task_type": task_type}, ctx))
        self._starting[session_id] = task
        return await asyncio.shield(task)

    async def _start(self, session_id: str, task_type: str, spec: Any, row: dict, ctx: RolloutContext) -> dict:
        try:
            state = await self._hook("start", "start_errors", spec.start, EpisodeState, row, ctx)
        finally:
            self._starting.pop(session_id, None)
        answer = json.loads(json.dumps({"session_id": session_id, "messages": state.messages, "tools": state.tools},
                                       default=str))
        self.sessions[session_id] = _Session(session_id, task_type, spec, state,
                                             str(ctx.task_config.get("parser") or "hermes"), answer)
        self.counts["sessions_started"] += 1
        return answer

    def _session(self, body: dict) -> _Session:
        sid = body.get("session_id")
        if not isinstance(sid, str):
            raise ServiceError(400, "bad_request", "'session_id' (a string) is required")
        s = self.sessions.get(sid)
        if s is None:
            if self.ended.get(sid) == "reaped":
                raise ServiceError(404, "unknown_session", f"session {sid!r} was reaped after "
                                                           f"{self.session_ttl_s} s without requests")
            why = "has ended" if sid in self.ended else "was never started on this service (or it restarted)"
            raise ServiceError(404, "unknown_session", f"session {sid!r} {why}")
        s.last_used = time.monotonic()
        return s

    async def step(self, body: dict) -> dict:
        s = self._session(body)
        turn, message = body.get("turn"), body.get("message")
        if not isinstance(turn, int) or isinstance(turn, bool) or not isinstance(message, dict):
            raise ServiceError(400, "bad_request", "/step needs 'turn' (an integer) and 'message' (an object)")
        s.busy += 1
        try:
            async with s.lock:
                if s.id not in self.sessions:  # ended (or reaped) while this request waited
                    self._session(body)
                if s.step_answer is not None and s.step_answer[0] == turn:  # a retry: the same answer
                    self.counts["step_repeats"] += 1
                    answer = s.step_answer[1]
                elif turn != s.turn + 1:
                    raise ServiceError(409, "out_of_order", f"session {s.id!r}: turn {turn} after turn {s.turn}; "
                                                            f"expected {s.turn + 1}")
                else:
                    answer = await self._step(s, turn, message, body.get("finish_reason") or "stop")
                    s.turn, s.step_answer = turn, (turn, answer)
        finally:
            s.busy -= 1
            s.last_used = time.monotonic()
        if isinstance(answer, ServiceError):
            raise answer
        return answer

    async def _step(self, s: _Session, turn: int, message: dict, finish_reason: str) -> Any:
        """Run ``obs`` for one assistant turn; its answer, or the ServiceError to repeat to retries."""
        state = s.state
        text = assistant_text(message, s.parser)
        state.messages.append({"role": "assistant", "content": text})
        state.num_turns = turn
        try:
            ob = await self._hook("obs", "step_errors", s.spec.obs, Observation, state,
                                  GenOutput([], None, text, str(finish_reason)))
        except ServiceError as e:
            return e
        messages = copy.deepcopy(list(ob.messages))
        ids = [tc.get("id") for tc in message.get("tool_calls") or [] if isinstance(tc, dict)]
        tool_msgs = [m for m in messages if m.get("role") == "tool"]
        if ids and all(ids) and len(tool_msgs) == len(ids):
            for m, call_id in zip(tool_msgs, ids):
                m.setdefault("tool_call_id", call_id)
        if not ob.done:
            state.messages.extend(messages)
        self.counts["steps"] += 1
        return json.loads(json.dumps({"messages": messages, "done": bool(ob.done), "turn_reward": ob.turn_reward,
                                      "metrics": ob.metrics, "info": ob.info}, default=str))

    async def end(self, body: dict) -> dict:
        previous = self.ended.get(body.get("session_id")) if isinstance(body.get("session_id"), str) else None
        if isinstance(previous, dict):  # a retry of /end: the same answer
            return previous
        if isinstance(previous, ServiceError):
            raise previous
        s = self._session(body)
        error = body.get("error")
        if error is not None and not (isinstance(error, dict) and isinstance(error.get("type"), str)):
            raise ServiceError(400, "bad_request", "'error' must be null or {\"type\", \"message\"}")
        async with s.lock:
            if s.id not in self.sessions:  # ended while this request waited for the lock
                return await self.end(body)
            s.state.finish_reason = body.get("finish_reason") or s.state.finish_reason
            if error is not None:
                s.state.error = EpisodeError(error["type"], str(error.get("message", "")))
            answer = await self._end(s)
        self._forget(s.id, answer)
        if isinstance(answer, ServiceError):
            raise answer
        return answer

    async def _end(self, s: _Session) -> Any:
        try:
            result = await self._hook("end", "end_errors", s.spec.end, EpisodeResult, s.state)
        except ServiceError as e:
            return e
        self.counts["sessions_ended"] += 1
        return json.loads(json.dumps({"reward": float(result.reward), "metrics": result.metrics}, default=str))

    def _forget(self, session_id: str, outcome: Any) -> None:
        self.sessions.pop(session_id, None)
        self.ended[session_id] = outcome
        while len(self.ended) > ENDED_MEMORY:
            self.ended.popitem(last=False)

    # -- housekeeping ------------------------------------------------------------------------------
    async def _close_session(self, s: _Session, error: EpisodeError, outcome: str) -> None:
        async with s.lock:
            if s.id not in self.sessions:
                return
            s.state.error = s.state.error or error
            s.state.finish_reason = s.state.finish_reason or "error"
            await self._end(s)
            self._forget(s.id, outcome)

    async def reap(self) -> int:
        """End the sessions idle for longer than ``session_ttl_s``; how many."""
        now = time.monotonic()
        idle = [s for s in list(self.sessions.values()) if not s.busy and now - s.last_used > self.session_ttl_s]
        err = EpisodeError("timeout", f"the environment service reaped the session after {self.session_ttl_s} s idle")
        for s in idle:
            await self._close_session(s, err, "reaped")
        self.counts["sessions_reaped"] += len(idle)
        return len(idle)

    async def reap_forever(self) -> None:
        every = max(0.05, min(self.session_ttl_s / 4, 30.0))
        while True:
            await asyncio.sleep(every)
            await self.reap()

    async def close(self) -> None:
        """End every live session (shutdown)."""
        self.closing = True
        err = EpisodeError("cancelled", "the environment service shut down")
        await asyncio.gather(*(self._close_session(s, err, "shutdown") for s in list(self.sessions.values())),
                             return_exceptions=True)

    def health(self) -> dict:
        return {"status": "ok", "tasks": TASKS.names(), "sessions": len(self.sessions),
                "sessions_by_task": dict(Counter(s.task_type for s in self.sessions.values())),
                "session_ttl_s": self.session_ttl_s, "hook_timeout_s": self.hook_timeout_s,
                "stats": dict(self.counts)}


_SERVICE = web.AppKey("service", EnvService)


def _handler(method: str):
    async def handle(request: web.Request) -> web.Response:
        body = await read_json_object(request)
        return web.json_response(await getattr(request.app[_SERVICE], method)(body))

    return handle


async def _health(request: web.Request) -> web.Response:
    return web.json_response(request.app[_SERVICE].health())


def make_app(service: Optional[EnvService] = None, **kwargs: Any) -> web.Application:
    """The aiohttp application; ``kwargs`` go to ``EnvService`` when none is given."""
    service = service or EnvService(**kwargs)
    app = web.Application(client_max_size=64 * 2**20, middlewares=[error_middleware(service.counts)])
    app[_SERVICE] = service
    reaper: list[asyncio.Task] = []

    async def on_startup(app: web.Application) -> None:
        reaper.append(asyncio.create_task(service.reap_forever(), name="envserver-reaper"))

    async def on_shutdown(app: web.Application) -> None:
        for t in reaper:
            t.cancel()
        await service.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.router.add_get("/health", _health)
    for name in ("start", "step", "end"):
        app.router.add_post(f"/{name}", _handler(name))
    return app


@contextlib.asynccontextmanager
async def serve(service: Optional[EnvService] = None, host: str = "127.0.0.1", port: int = 0,
                **kwargs: Any) -> AsyncIterator[str]:
    """Serve in this event loop; yields ``http://host:port`` (the real port when ``port=0``)."""
    async with serve_app(make_app(service, **kwargs), host, port, shutdown_timeout=2.0) as url:
        yield url


__all__ = ["EnvService", "ServiceError", "assistant_text", "make_app", "serve"]
