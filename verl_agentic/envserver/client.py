"""``EnvClient``: talks to ``python -m verl_agentic.envserver`` with timeouts and safe retries.

Every call is idempotent on the server (a client-chosen session id for ``/start``, the turn number
for ``/step``, remembered answers for ``/end``), so the client may retry any of them:

- retried: connection errors, requests past ``request_timeout_s``, answers that are not the
  expected JSON, 5xx answers without the service's typed error body (a proxy or a crashed
  server), and typed errors the service marks ``retryable`` (503 ``shutting_down``); up to
  ``max_retries`` times after ``retry_backoff_s`` doubling per retry (capped at 8 s), with jitter.
- not retried: the service's typed errors (the task raised, bad request, unknown session, ...):
  repeating them gives the same answer.

A call that fails raises ``EnvServiceError`` (a ``serving.ServiceError``) with a ``type``: the
service's error type, or ``service_unavailable`` (unreachable / 5xx), ``timeout`` (no answer in
time) or ``bad_response`` (garbage) once the retries are used up. The transport is
``serving.HttpTransport``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.serving import HttpTransport, ServiceError

BACKOFF_CAP_S = 8.0


class EnvServiceError(ServiceError):
    def __init__(self, type: str, message: str, status: Optional[int] = None, retryable: bool = False):
        super().__init__(status, type, message, retryable=retryable)


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
        self._http = HttpTransport(url, name="environment service", request_timeout_s=request_timeout_s,
                                   max_retries=max_retries, retry_backoff_s=retry_backoff_s, backoff_cap_s=BACKOFF_CAP_S,
                                   unrecorded_fields=("session_id",))  # made up by the client per episode
        if request_timeout_s is None:
            raise ConfigError(f"environment service: request_timeout_s must be > 0, got {request_timeout_s}")
        self.url = self._http.url
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)

    @property
    def counts(self) -> Counter:
        """``requests`` (attempts), ``retries`` and ``failed_requests``."""
        return self._http.counts

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
        return await self._http.request("GET", "/health")

    async def close(self) -> None:
        await self._http.close()

    async def _post(self, path: str, payload: dict, shape: dict) -> dict:
        try:
            return await self._http.request("POST", path, json_body=payload, check=lambda a: _shape_error(a, shape))
        except ServiceError as e:
            where = f"environment service {self.url}{path}: "
            message = e.message if e.message.startswith(where) else where + e.message  # the service's own words
            raise EnvServiceError(e.type, message, e.status, e.retryable) from None
