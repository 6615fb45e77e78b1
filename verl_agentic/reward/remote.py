"""``remote`` (alias ``swedev``, its first name): scores through a reward server over HTTP.

Start the server (``python -m verl_agentic.reward.server --port 8000``, see ``server.py``), then::

    manager = make_reward_manager(RewardConfig(manager="remote", url="http://host:8000"))
    results = manager.score_items(items)          # or: await manager.ascore_items(items)

The scores are the server's scorers' (the same ``run_scorer`` as ``naive``); the client adds
transport, batching and fault handling:

- **Batches**: consecutive runs of at most ``batch_size`` items whose JSON body stays under
  ``MAX_BODY_BYTES`` (16 MB) and the server's own limit (read from ``GET /health``), so a batch
  of 1 MB strings still goes through. At most ``concurrency`` requests are in flight, over one
  ``aiohttp`` session per call. ``reward.scorer`` is sent as each item's ``scorer`` (when it names
  none) and ``reward.scorer_kwargs`` with every request, so the semantics equal ``naive``'s.
- **Request timeout**: ``request_timeout_s`` when set; else
  ``T * ceil(concurrency * n / W) + 10`` seconds for a batch of ``n`` items, where ``T`` is the
  server's per-item timeout and ``W`` its worker count (from ``GET /health``; before the server
  has answered: ``timeout_s`` and ``num_workers``/CPU count of this config). That is the time the
  server needs when every item in flight hangs until its timeout. With no per-item limit on
  either side, a request has no time limit.
- **Retries**: connection errors, timeouts, 5xx answers and malformed answers (not JSON, not
  ``{"results": [...]}``, the wrong number of results, an invalid result) are retried up to
  ``max_retries`` times, after ``retry_backoff_s`` doubling per retry (capped at 8 s) with
  jitter. 4xx answers are not retried: a 413 splits the batch in halves, and a single item that
  is still too large gets ``request_too_large``; any other 4xx gives every item of the batch
  ``bad_response`` with the server's message.
- **Exhausted retries**: every item of the batch gets ``service_unavailable`` (the server could
  not be reached / answered 5xx / timed out) or ``bad_response`` (it answered garbage), never a
  silent 0; ``failure_policy`` then sets the score as for any failed sample.

``stats()`` adds ``requests`` (HTTP attempts), ``retries`` and ``failed_requests`` (batches
given up on). The transport is ``serving.HttpTransport``; the sync API runs the requests on a
``serving.BackgroundLoop`` (a private event loop in a helper thread), so it works whether or not
the calling thread runs an event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from collections import Counter
from dataclasses import replace
from typing import Any, Optional, Sequence
from urllib.parse import urlparse

from verl_agentic.interfaces import ConfigError
from verl_agentic.reward.base import (
    REWARD_MANAGERS,
    RewardConfig,
    RewardError,
    RewardItem,
    RewardManager,
    RewardResult,
    register_reward_manager,
)
from verl_agentic.reward.progress import progress_bar
from verl_agentic.serving import BackgroundLoop, HttpTransport, ServiceError

MAX_BODY_BYTES = 16 * 2**20  # per request, unless the server accepts less
BACKOFF_CAP_S = 8.0
HEALTH_TIMEOUT_S = 5.0
_ENVELOPE_BYTES = 4096  # room for the request's non-item fields


@register_reward_manager("remote")
class RemoteRewardManager(RewardManager):
    """Client of ``python -m verl_agentic.reward.server``; see the module docstring."""

    local_scorers = False  # the service's registry decides (it ignores kwargs of scorers no item uses)

    def __init__(self, config: Optional[RewardConfig] = None):
        config = config or RewardConfig(manager=self.name)
        # The scorers run on the server: their modules need not be importable here.
        super().__init__(replace(config, scorer_modules=[]))
        self.config = config
        cfg = config
        if not cfg.url:
            raise ConfigError(f"reward.url is required for reward.manager={self.name}: the http://host:port of a reward "
                              "server (start one with `python -m verl_agentic.reward.server --port 8000`)")
        parsed = urlparse(cfg.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"reward.url must look like http://host:port, got {cfg.url!r}")
        for key, low in (("batch_size", 1), ("concurrency", 1), ("max_retries", 0)):
            if not isinstance(getattr(cfg, key), int) or getattr(cfg, key) < low:
                raise ConfigError(f"reward.{key} must be an integer >= {low}, got {getattr(cfg, key)!r}")
        if cfg.retry_backoff_s < 0:
            raise ConfigError(f"reward.retry_backoff_s must be >= 0, got {cfg.retry_backoff_s}")
        if cfg.request_timeout_s is not None and cfg.request_timeout_s <= 0:
            raise ConfigError(f"reward.request_timeout_s must be > 0 or null, got {cfg.request_timeout_s}")
        self.url = cfg.url.rstrip("/")
        self._server: Optional[dict] = None  # GET /health, once it answered
        self._net: Counter = Counter(requests=0, retries=0, failed_requests=0)
        self._loop = BackgroundLoop("verl-agentic-reward-client")

    # -- public -------------------------------------------------------------------------------
    def _score_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        return self._loop.run(self._score(list(items)))

    async def ascore_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Natively async (in the caller's loop); the same bookkeeping as ``score_items``."""
        items = list(items)
        t0 = time.perf_counter()
        results = await self._score(items)
        return self._account(results, time.perf_counter() - t0)

    def stats(self) -> dict:
        return {**super().stats(), **self._net}

    def close(self) -> None:
        self._loop.close()

    # -- internals ------------------------------------------------------------------------------
    def request_timeout(self, n: int) -> Optional[float]:
        """Seconds allowed for one request of ``n`` items (see the module docstring)."""
        cfg = self.config
        if cfg.request_timeout_s is not None:
            return cfg.request_timeout_s
        server = self._server or {}
        per_item = server["timeout_s"] if "timeout_s" in server else cfg.timeout_s
        if per_item is None:
            return None
        workers = server.get("workers") or cfg.workers
        return per_item * math.ceil(cfg.concurrency * n / max(1, int(workers))) + 10.0

    async def _health(self, http: HttpTransport) -> None:
        """Learn the server's limits once; a server that does not answer yet is left to the retries."""
        if self._server is not None:
            return
        try:
            self._server = await http.request("GET", "/health", timeout_s=HEALTH_TIMEOUT_S, max_retries=0)
        except ServiceError:
            return

    def _batches(self, encoded: list[bytes]) -> tuple[list[list[int]], list[int]]:
        """Consecutive index runs within the item and byte limits; and the items too large to send."""
        budget = MAX_BODY_BYTES
        server_limit = (self._server or {}).get("max_request_bytes")
        if isinstance(server_limit, int):
            budget = min(budget, server_limit - _ENVELOPE_BYTES)
        batches: list[list[int]] = []
        too_large: list[int] = []
        size = 0
        for i, body in enumerate(encoded):
            if isinstance(server_limit, int) and len(body) > server_limit - _ENVELOPE_BYTES:
                too_large.append(i)
                continue
            if not batches or len(batches[-1]) >= self.config.batch_size or size + len(body) > budget:
                batches.append([])
                size = 0
            batches[-1].append(i)
            size += len(body) + 1
        return batches, too_large

    async def _score(self, items: list[RewardItem]) -> list[RewardResult]:
        if not items:
            return []
        cfg = self.config
        results: list[Optional[RewardResult]] = [None] * len(items)
        encoded = []
        for item in items:
            d = item.as_dict()
            d["scorer"] = d["scorer"] or cfg.scorer
            encoded.append(json.dumps(d, separators=(",", ":")).encode())
        async with HttpTransport(self.url, name="reward server", concurrency=cfg.concurrency,
                                 retry_backoff_s=cfg.retry_backoff_s, backoff_cap_s=BACKOFF_CAP_S) as http:
            await self._health(http)
            http.counts.clear()  # the health check is not a scoring request
            batches, too_large = self._batches(encoded)
            for i in too_large:
                results[i] = _failed("request_too_large", f"the item's JSON is {len(encoded[i])} bytes, over the "
                                     f"server's limit of {self._server['max_request_bytes']} bytes per request")
            sem = asyncio.Semaphore(cfg.concurrency)
            with progress_bar(len(items), "remote scoring", cfg.progress) as bar:
                await asyncio.gather(*(self._run_batch(http, sem, idx, encoded, results, bar) for idx in batches))
        self._net["requests"] += http.counts["requests"]
        self._net["retries"] += http.counts["retries"]
        return [r if r is not None else _failed("bad_response", "no result (client bug)") for r in results]

    async def _run_batch(self, http: HttpTransport, sem: asyncio.Semaphore, idx: list[int],
                         encoded: list[bytes], results: list, bar: Any) -> None:
        cfg = self.config
        body = b'{"items":[' + b",".join(encoded[i] for i in idx) + b"]"
        if cfg.scorer_kwargs:
            body += b',"scorer_kwargs":' + json.dumps(cfg.scorer_kwargs).encode()
        body += b"}"
        check = functools.partial(_check_results, n=len(idx))
        try:
            async with sem:
                # the transport retries: scoring the same items twice is harmless
                answer = await http.request("POST", "/score", data=body, timeout_s=self.request_timeout(len(idx)),
                                            check=check, max_retries=cfg.max_retries)
            got = [RewardResult.from_dict(r) for r in answer["results"]]
        except ServiceError as e:
            if e.status == 413 and len(idx) > 1:  # the server takes less than we thought: halve and go on
                half = len(idx) // 2
                await asyncio.gather(self._run_batch(http, sem, idx[:half], encoded, results, bar),
                                     self._run_batch(http, sem, idx[half:], encoded, results, bar))
                return
            got = [_failed(*_result_error(e)) for _ in idx]
            if e.status != 413:
                self._net["failed_requests"] += 1
        for i, r in zip(idx, got):
            results[i] = r
        bar.update(len(idx))


def _check_results(answer: dict, n: int) -> Optional[str]:
    """What is wrong with a ``/score`` answer for ``n`` items, or None."""
    results = answer.get("results")
    if not isinstance(results, list):
        return f"expected {{\"results\": [...]}}, got {json.dumps(answer)[:200]}"
    if len(results) != n:
        return f"{len(results)} results for {n} items"
    try:
        for r in results:
            RewardResult.from_dict(r)
    except (ValueError, TypeError) as e:
        return str(e)[:300]
    return None


def _result_error(e: ServiceError) -> tuple[str, str]:
    """The item error type and message for a batch the transport gave up on."""
    if e.status == 413:
        return "request_too_large", f"the server refused the request as too large (HTTP 413): {e.message}"
    if e.type == "bad_response" or (e.status is not None and 400 <= e.status < 500):
        return "bad_response", e.message if e.type == "bad_response" else \
            f"{e.message} (the server rejected the request: HTTP {e.status} {e.type})"
    return "service_unavailable", e.message


def _failed(type: str, message: str) -> RewardResult:
    return RewardResult(None, {}, RewardError(type, message))


# ``swedev`` was its first name (it was written for the SWE tasks); it stays an alias, and a manager
# selected by it reports it as its name
REWARD_MANAGERS.register("swedev", RemoteRewardManager)
SWEDevRewardManager = RemoteRewardManager
