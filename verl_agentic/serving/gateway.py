"""An OpenAI-compatible endpoint on loopback for many episodes: the API key names the episode.

An agent program (the OpenAI SDK, an agent framework, a command) talks to the policy through this
endpoint; each of its requests is handed to the session of the episode its API key names, which
answers it (``verl_agentic.tasks.agent`` owns the tokens: it renders, generates and parses)::

    gateway = Gateway()
    base_url, key = await gateway.open(session)      # the server starts with the first session
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key)
    ...
    await gateway.close(key)                         # and stops when the last one leaves

Routes: ``POST /v1/chat/completions`` (``session.complete(body)`` answers it; with ``stream=true``
the whole answer comes as server-sent ``chat.completion.chunk`` events: ``completion_chunks``) and
``POST /v1/responses`` (the Responses API, translated to and from a chat completion, and streamed as
the Responses protocol's own events: ``serving/responses.py``) and ``GET /v1/models`` (the one model, ``model_name``). A request with an
unknown or missing key is a 401 naming the problem; a session's ``ServiceError`` is answered in the
shape every service here uses, ``{"error": {"type", "message", ...}}``, which the OpenAI SDK reads as
its own (``error.message``). The server listens on 127.0.0.1 only, at a free port.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any, Optional, Protocol

from aiohttp import web

from verl_agentic.serving.errors import ServiceError
from verl_agentic.serving.responses import chat_request, response_events, response_object
from verl_agentic.serving.server import error_middleware, read_json_object

MAX_BODY_BYTES = 64 << 20  # an agent's whole conversation travels in every request


class ChatSession(Protocol):
    async def complete(self, body: dict) -> dict:
        """The ``chat.completion`` object answering ``body``; raises ``ServiceError`` for a bad request."""


class Gateway:
    """One loopback HTTP server shared by the open sessions (see the module docstring)."""

    def __init__(self, model_name: str = "policy"):
        self.model_name = model_name
        self._sessions: dict[str, ChatSession] = {}
        self._runner: Optional[web.AppRunner] = None
        self._url: Optional[str] = None
        self._lock = asyncio.Lock()

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    async def open(self, session: ChatSession) -> tuple[str, str]:
        """Register ``session``; returns ``(base_url, api_key)`` for its client (base_url ends in ``/v1``)."""
        async with self._lock:
            if self._runner is None:
                await self._start()
            key = "va-" + secrets.token_urlsafe(18)
            self._sessions[key] = session
            return f"{self._url}/v1", key

    async def close(self, key: str) -> None:
        """Forget the session of ``key``; the server stops when none is left."""
        async with self._lock:
            self._sessions.pop(key, None)
            if not self._sessions and self._runner is not None:
                runner, self._runner, self._url = self._runner, None, None
                await runner.cleanup()

    async def _start(self) -> None:
        app = web.Application(middlewares=[error_middleware()], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self._runner, self._url = runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    def _session(self, request: web.Request) -> ChatSession:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            raise ServiceError(401, "invalid_api_key", "no API key: send 'Authorization: Bearer <the episode's key>' "
                                                       "(the OpenAI SDK does, from api_key)")
        session = self._sessions.get(auth[len("Bearer "):].strip())
        if session is None:
            raise ServiceError(401, "invalid_api_key", "unknown API key: it names no running episode (each episode's "
                                                       "agent gets its own key; it stops working when the episode ends)")
        return session

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        body = await read_json_object(request)
        stream, options = bool(body.pop("stream", False)), body.pop("stream_options", None) or {}
        completion = await session.complete(body)  # an error is a plain JSON answer, streaming or not
        if not stream:
            return web.json_response(completion)
        chunks = completion_chunks(completion, include_usage=bool(options.get("include_usage")))
        return await _event_stream(request, [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
                                   + [b"data: [DONE]\n\n"])

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        body = await read_json_object(request)
        stream = bool(body.pop("stream", False))
        body.pop("stream_options", None)
        answer = response_object(await session.complete(chat_request(body)), body)
        if not stream:
            return web.json_response(answer)
        return await _event_stream(request, [
            f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in response_events(answer)])

    async def _models(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return web.json_response({"object": "list", "data": [
            {"id": getattr(session, "model_name", self.model_name), "object": "model", "created": int(time.time()), "owned_by": "verl-agentic"}]})


async def _event_stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    """Answer ``request`` with server-sent ``events`` (each already framed), then end the stream."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def completion_chunks(completion: dict, include_usage: bool = False) -> list[dict]:
    """A ``chat.completion`` as the ``chat.completion.chunk`` events a streaming client reads: the whole
    message (content, tool calls with their index, logprobs) in one delta, then the finish reason, then
    (``stream_options.include_usage``) the usage with no choices. The turn is generated whole before it
    is answered, so streaming it token by token would only delay it."""
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                    "logprobs": choice.get("logprobs")}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion.get("usage")})
    return chunks


_GATEWAYS: dict[Any, Gateway] = {}


def gateway_for_loop() -> Gateway:
    """The gateway of the running event loop (one per loop: a server lives in the loop that serves it)."""
    loop = asyncio.get_running_loop()
    for old in [k for k in _GATEWAYS if k.is_closed()]:
        del _GATEWAYS[old]
    if loop not in _GATEWAYS:
        _GATEWAYS[loop] = Gateway()
    return _GATEWAYS[loop]


__all__ = ["ChatSession", "Gateway", "completion_chunks", "gateway_for_loop"]
