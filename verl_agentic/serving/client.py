"""The client half: one HTTP transport with retries, and one event loop in a helper thread.

``HttpTransport`` is what the environment, sandbox and reward clients send their requests through:
JSON in, a JSON object out, or a ``ServiceError`` (``errors.py``). Per attempt:

- no connection could be made (nothing was sent): always retried;
- a timeout or a connection that broke mid-request, a 5xx (or 429) without the service's error
  shape, an answer that is not a JSON object or fails the caller's ``check``: retried when the
  request is ``idempotent`` (safe to send twice);
- the service's own typed error: retried only when it says ``retryable`` (and the request is
  idempotent); otherwise raised at once, with the service's type and message as they are.

Up to ``max_retries`` retries, after ``retry_backoff_s`` doubling per retry (capped at
``backoff_cap_s``) with jitter (half the delay plus a random half); a request that gives up says
``(gave up after N attempts)``; the client's own failures start with ``"<name> <url><path>: "``. ``counts`` has ``requests`` (attempts), ``retries`` and
``failed_requests``. The ``aiohttp`` session is made on first use, in the running event loop.

``BackgroundLoop`` runs coroutines on a private event loop in a daemon thread: what a synchronous
API (a reward manager's ``score_items``) or a client shared by many event loops (the openai
backend) sits on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import random
import threading
from collections import Counter
from collections.abc import Coroutine
from typing import Any, Callable, Optional, TypeVar
from urllib.parse import urlparse

import aiohttp

from verl_agentic.interfaces import ConfigError
from verl_agentic.record.tape import digest, door
from verl_agentic.serving.errors import ServiceError, body_excerpt, error_from_answer

_T = TypeVar("_T")
_DEFAULT = object()


class HttpTransport:
    """Requests to one service at ``url``; see the module docstring. ``name`` starts its messages."""

    def __init__(self, url: str, *, name: str, request_timeout_s: Optional[float] = 60.0, max_retries: int = 3,
                 retry_backoff_s: float = 0.5, backoff_cap_s: float = 8.0, concurrency: Optional[int] = None,
                 fresh_connections: bool = False, headers: Optional[dict] = None,
                 unrecorded_fields: tuple[str, ...] = ()):
        parsed = urlparse(url or "") if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"{name} url must look like http://host:port, got {url!r}")
        if (request_timeout_s is not None and request_timeout_s <= 0) or not isinstance(max_retries, int) \
                or max_retries < 0 or retry_backoff_s < 0:
            raise ConfigError(f"{name}: request_timeout_s must be > 0 (or null), max_retries an integer >= 0 and "
                              f"retry_backoff_s >= 0; got {request_timeout_s}, {max_retries!r}, {retry_backoff_s}")
        self.url = url.rstrip("/")
        self.name = name
        self.request_timeout_s = None if request_timeout_s is None else float(request_timeout_s)
        self.max_retries = max_retries
        self.retry_backoff_s = float(retry_backoff_s)
        self.backoff_cap_s = float(backoff_cap_s)
        self.concurrency = concurrency
        # fresh_connections: one connection per request, so a restarted service shows as a refused
        # connection (retried) rather than as a pooled connection that died mid-request
        self.fresh_connections = fresh_connections
        self.headers = headers
        # body fields that differ on every run by design (an idempotency key, a session id the client makes
        # up): left out of what a recorded request is matched by (record/tape.py)
        self.unrecorded_fields = tuple(unrecorded_fields)
        self.counts: Counter = Counter(requests=0, retries=0, failed_requests=0)
        self._session: Optional[aiohttp.ClientSession] = None

    async def __aenter__(self) -> "HttpTransport":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.concurrency or 100, force_close=self.fresh_connections)
            self._session = aiohttp.ClientSession(connector=connector, headers=self.headers)
        return self._session

    async def request(self, method: str, path: str, *, json_body: Any = None, data: Optional[bytes] = None,
                      params: Optional[dict] = None, idempotent: bool = True, timeout_s: Any = _DEFAULT,
                      check: Optional[Callable[[dict], Optional[str]]] = None,
                      max_retries: Optional[int] = None) -> dict:
        """One call with retries: the answer's JSON object, or ``ServiceError``. ``timeout_s``: this
        request's limit (default ``request_timeout_s``; None: none). ``check(answer)`` returns what is
        wrong with an answer, or None. ``max_retries`` overrides the transport's for this call.

        The ``http`` door of a recorded episode (``record/tape.py``): the answer, or the final error, is
        recorded by method, path and body (not the URL: a replayed service may listen elsewhere)."""
        if isinstance(json_body, dict) and self.unrecorded_fields:
            shown = {k: v for k, v in json_body.items() if k not in self.unrecorded_fields}
        else:
            shown = json_body
        body = digest(shown) if data is None else {"bytes_sha256": hashlib.sha256(data).hexdigest()}
        return await door("http", {"method": method, "path": path, "params": params, "body": body},
                          lambda: self._request(method, path, json_body, data, params, idempotent, timeout_s, check,
                                                max_retries),
                          error_of=_error_json, raise_error=_error_from_json)

    async def _request(self, method: str, path: str, json_body: Any, data: Optional[bytes], params: Optional[dict],
                       idempotent: bool, timeout_s: Any, check: Optional[Callable[[dict], Optional[str]]],
                       max_retries: Optional[int]) -> dict:
        timeout = self.request_timeout_s if timeout_s is _DEFAULT else timeout_s
        retries = self.max_retries if max_retries is None else max_retries
        attempt = 0
        while True:
            self.counts["requests"] += 1
            try:
                return await self._attempt(method, path, json_body, data, params, timeout, check)
            except _Attempt as failed:
                error, retry = failed.error, failed.nothing_sent or (idempotent and failed.error.retryable)
            if not retry or attempt >= retries:
                self.counts["failed_requests"] += 1
                if retry:
                    error.message += f" (gave up after {attempt + 1} attempts)"
                    error.args = (error.message,)
                raise error
            delay = min(self.backoff_cap_s, self.retry_backoff_s * 2**attempt)
            await asyncio.sleep(delay / 2 + random.uniform(0, delay / 2))
            attempt += 1
            self.counts["retries"] += 1

    async def _attempt(self, method: str, path: str, json_body: Any, data: Optional[bytes], params: Optional[dict],
                       timeout: Optional[float], check: Optional[Callable[[dict], Optional[str]]]) -> dict:
        where = f"{self.name} {self.url}{path}"
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self.session().request(method, f"{self.url}{path}", json=json_body, data=data, params=params,
                                              headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                status, raw = r.status, await r.read()
        except aiohttp.ClientConnectorError as e:
            raise _Attempt(ServiceError(None, "service_unavailable", f"{where}: cannot reach the server: {e}",
                                        retryable=True), nothing_sent=True) from None
        except (TimeoutError, asyncio.TimeoutError):
            raise _Attempt(ServiceError(None, "timeout", f"{where}: no answer within {timeout} s",
                                        retryable=True)) from None
        except aiohttp.ClientError as e:
            raise _Attempt(ServiceError(None, "service_unavailable", f"{where}: {type(e).__name__}: {e}",
                                        retryable=True)) from None
        if status >= 400:
            typed = error_from_answer(status, raw)
            if typed is not None:  # the service's own words (a tool may show them to the model)
                raise _Attempt(typed)
            if status >= 500 or status == 429:
                raise _Attempt(ServiceError(status, "service_unavailable", f"{where}: HTTP {status}: "
                                            f"{body_excerpt(raw)}", retryable=True))
            raise _Attempt(ServiceError(status, "bad_response", f"{where}: HTTP {status}: {body_excerpt(raw)}"))
        try:
            answer = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            answer = None
        problem = (f"expected a JSON object, got {body_excerpt(raw, 200)!r}" if not isinstance(answer, dict)
                   else check(answer) if check is not None else None)
        if problem:
            raise _Attempt(ServiceError(status, "bad_response", f"{where}: malformed answer: {problem}",
                                        retryable=True))
        return answer


def _error_json(e: BaseException) -> Optional[dict]:
    if not isinstance(e, ServiceError):
        return None
    return {"status": e.status, "type": e.type, "message": e.message, "retryable": e.retryable, "extra": e.extra}


def _error_from_json(d: dict) -> ServiceError:
    return ServiceError(d["status"], d["type"], d["message"], retryable=d["retryable"], **d["extra"])


class _Attempt(Exception):
    """One attempt failed with ``error``; ``nothing_sent``: the request never left (always safe to retry)."""

    def __init__(self, error: ServiceError, nothing_sent: bool = False):
        super().__init__(error.message)
        self.error, self.nothing_sent = error, nothing_sent


class BackgroundLoop:
    """An event loop in a daemon thread, started on first use; ``close`` stops it."""

    def __init__(self, name: str):
        self.name = name
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
                self._thread.start()
            return self._loop

    @property
    def started(self) -> bool:
        return self._loop is not None

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future:
        """Schedule ``coro`` on the loop; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and wait for its result (from a thread that is not the loop's)."""
        return self.submit(coro).result()

    def close(self, final: Optional[Callable[[], Coroutine[Any, Any, Any]]] = None, timeout_s: float = 10.0) -> None:
        """Run ``final()`` on the loop (if given, and the loop ran; its error is raised after the loop
        stopped), then stop the loop and its thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        try:
            if final is not None:
                try:
                    asyncio.run_coroutine_threadsafe(final(), loop).result(timeout=timeout_s)
                except concurrent.futures.TimeoutError:
                    pass  # the loop stops anyway
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=timeout_s)
            if not loop.is_running():
                loop.close()


__all__ = ["BackgroundLoop", "HttpTransport"]
