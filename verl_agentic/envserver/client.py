"""``EnvClient``: talks to ``python -m verl_agentic.envserver`` with timeouts and safe retries.

Every call is idempotent on the server (a client-chosen session id for ``/start``, the turn number
for ``/step``, remembered answers for ``/end``), so the client may retry any of them:

- retried: connection errors, requests past ``request_timeout_s``, answers that are not the
  expected JSON, 5xx answers without the service's typed error body (a proxy or a crashed
  server), and typed errors the service marks ``retryable`` (503 ``shutting_down``); up to
  ``max_retries`` times after ``retry_backoff_s`` doubling per retry (capped at 8 s), with jitter.
- not retried: the service's typed errors (the task raised, bad request, unknown session, ...):
  repeating them gives the same answer.

A call that fails raises ``EnvServiceError`` with a ``type``: the service's error type, or
``service_unavailable`` (unreachable / 5xx), ``timeout`` (no answer in time) or ``bad_response``
(garbage) once the retries are used up.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from typing import Any, Callable, Optional

import aiohttp

from verl_agentic.interfaces import ConfigError

BACKOFF_CAP_S = 8.0


class EnvServiceError(Exception):
    def __init__(self, type: str, message: str, status: Optional[int] = None, retryable: bool = False):
        super().__init__(message)
        self.type, self.message, self.status, self.retryable = type, message, status, retryable


def _shape_error(answer: Any, checks: dict[str, Callable[[Any], bool]]) -> Optional[str]:
    if not isinstance(answer, dict):
        return f"expected a JSON object, got {type(answer).__name__}"
    bad = [k for k, ok in checks.items() if not ok(answer.get(k))]
    return f"missing or mistyped fields {bad}" if bad else None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_messages(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in v)


START_SHAPE = {"session_id": lambda v: isinstance(v, str), "messages": _is_messages,
               "tools": lambda v: v is None or isinstance(v, list)}
STEP_SHAPE = {"messages": _is_messages, "done": lambda v: isinstance(v, bool),
              "turn_reward": lambda v: v is None or _is_number(v), "metrics": lambda v: isinstance(v, dict),
              "info": lambda v: v is None or isinstance(v, dict)}  # optional: older services send none
END_SHAPE = {"reward": _is_number, "metrics": lambda v: isinstance(v, dict)}


class EnvClient:
    """One client (one connection pool) per episode or per process; ``close`` it when done."""

    def __init__(self, url: str, *, request_timeout_s: float = 60.0, max_retries: int = 3,
                 retry_backoff_s: float = 0.5):
        if not isinstance(url, str) or not re.match(r"^https?://[^/]+", url):
            raise ConfigError(f"environment service url must look like http://host:port, got {url!r}")
        if request_timeout_s is None or request_timeout_s <= 0 or max_retries < 0 or retry_backoff_s < 0:
            raise ConfigError("request_timeout_s must be > 0, max_retries and retry_backoff_s >= 0; got "
                              f"{request_timeout_s}, {max_retries}, {retry_backoff_s}")
        self.url = url.rstrip("/")
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.counts: Counter = Counter()
        self._session: Optional[aiohttp.ClientSession] = None

    async def start(self, task_type: str, row: dict, *, session_id: str, task_config: Optional[dict] = None,
                    sample_index: int = 0, max_turns: int = 1, seed: Optional[int] = None) -> dict:
        return await self._post("/start", {"task_type": task_type, "row": row, "session_id": session_id,
                                           "task_config": task_config, "sample_index": sample_index,
                                           "max_turns": max_turns, "seed": seed}, START_SHAPE)

    async def step(self, session_id: str, turn: int, message: dict, finish_reason: Optional[str] = None) -> dict:
        return await self._post("/step", {"session_id": session_id, "turn": turn, "message": message,
                                          "finish_reason": finish_reason}, STEP_SHAPE)

    async def end(self, session_id: str, finish_reason: Optional[str] = None,
                  error: Optional[dict] = None) -> dict:
        return await self._post("/end", {"session_id": session_id, "finish_reason": finish_reason,
                                         "error": error}, END_SHAPE)

    async def health(self) -> dict:
        async with self._client().get(f"{self.url}/health",
                                      timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as r:
            return await r.json()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _attempt(self, path: str, payload: dict, shape: dict) -> dict:
        try:
            async with self._client().post(f"{self.url}{path}", json=payload,
                                           timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as r:
                status, body = r.status, await r.read()
        except (TimeoutError, asyncio.TimeoutError):
            raise EnvServiceError("timeout", f"no answer within {self.request_timeout_s} s", retryable=True) from None
        except aiohttp.ClientError as e:
            raise EnvServiceError("service_unavailable", f"{type(e).__name__}: {e}", retryable=True) from None
        try:
            answer = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise EnvServiceError("service_unavailable" if status >= 500 else "bad_response",
                                  f"answered {status} with non-JSON: {body[:80]!r}", status,
                                  retryable=status >= 500 or status == 200) from None
        if status != 200:
            err = answer.get("error") if isinstance(answer, dict) else None
            if isinstance(err, dict) and isinstance(err.get("type"), str):
                raise EnvServiceError(err["type"], str(err.get("message", "")), status, bool(err.get("retryable")))
            raise EnvServiceError("service_unavailable" if status >= 500 else "bad_response",
                                  f"answered {status}: {body[:200]!r}", status, retryable=status >= 500)
        problem = _shape_error(answer, shape)
        if problem:
            raise EnvServiceError("bad_response", f"malformed answer: {problem}", status, retryable=True)
        return answer

    async def _post(self, path: str, payload: dict, shape: dict) -> dict:
        for attempt in range(self.max_retries + 1):
            self.counts["requests"] += 1
            try:
                return await self._attempt(path, payload, shape)
            except EnvServiceError as e:
                if not e.retryable or attempt == self.max_retries:
                    self.counts["errors"] += 1
                    tries = f" (after {attempt + 1} attempts)" if attempt else ""
                    raise EnvServiceError(e.type, f"environment service {self.url}{path}: {e.message}{tries}",
                                          e.status, e.retryable) from None
                self.counts["retries"] += 1
                delay = min(self.retry_backoff_s * 2 ** attempt, BACKOFF_CAP_S)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")
