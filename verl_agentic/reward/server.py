"""The reward service: registered scorers behind HTTP, for ``reward.manager=remote`` (alias ``swedev``).

Run it next to (or far from) the trainer::

    python -m verl_agentic.reward.server --host 0.0.0.0 --port 8000 --workers 8 --timeout-s 30 \\
        --scorer-module my_scorers

and point the client at it: ``reward.manager=remote reward.url=http://host:8000``. It prints one
line, ``reward server listening on http://HOST:PORT``, when it is ready (``--port 0`` picks a free
port and prints the real one), and shuts down cleanly on SIGTERM / SIGINT (its scoring workers
exit with it).

Endpoints:

- ``GET /health`` -> ``{"status": "ok", "manager", "workers", "timeout_s", "max_request_bytes",
  "scorers": [...], "stats": {...}}``
- ``GET /scorers`` -> ``{"scorers": [...]}``
- ``POST /score`` with ``{"items": [RewardItem dicts], "scorer"?: name, "scorer_kwargs"?: {name: {...}}}``
  -> ``{"results": [{"score", "extra", "error"}, ...]}``, one per item, in order.

Scoring runs in a ``prime`` manager (a process pool: a per-item ``--timeout-s`` kills and
replaces a hung worker) without blocking the event loop. A bad *item* (unknown scorer, a
scorer that raises, hangs or returns garbage) gets a typed error in its result of a 200
answer; a bad *request* gets the services' error shape, ``{"error": {"type", "message",
"retryable"}}`` (``serving.ServiceError``): 400 ``bad_request`` (not JSON, not an object,
``items`` not a list, an invalid item — named by index and field —, malformed or
mismatched ``scorer_kwargs``), 404 ``unknown_scorer`` (the request-level ``scorer`` is not
registered; the answer lists the registered ones in ``scorers``), 413 ``request_too_large`` (the
body is over ``--max-request-mb``), 500 ``scoring_failed`` (the manager itself failed; retryable).

A request-level ``scorer`` applies to the items that name none, exactly like ``reward.scorer``.
``scorer_kwargs`` are per scorer name as in ``reward.scorer_kwargs`` (kwargs a registered scorer
cannot take are a 400). With ``prime`` they travel with each item to the one shared pool;
``--manager naive`` keeps one manager per distinct value (at most ``MAX_KWARGS_VARIANTS``).

In-process (tests, notebooks)::

    async with serve(RewardConfig(manager="prime", timeout_s=5)) as url:
        ...  # http://127.0.0.1:<free port>
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import sys
from collections import Counter
from dataclasses import replace
from typing import Any, AsyncIterator, Optional, Sequence

from aiohttp import web

from verl_agentic.interfaces import ConfigError
from verl_agentic.reward.base import (
    REWARD_MANAGERS,
    RewardConfig,
    RewardItem,
    RewardManager,
    RewardResult,
    make_reward_manager,
)
from verl_agentic.reward.scorers import SCORERS, import_scorer_modules
from verl_agentic.serving import ServiceError, error_middleware, read_json_object, run_service, serve_app

DEFAULT_MAX_REQUEST_MB = 64.0
MAX_KWARGS_VARIANTS = 8
SCORE_REQUEST_KEYS = ("items", "scorer", "scorer_kwargs")


class _Scoring:
    """Runs the server's scoring without blocking the event loop.

    With ``prime`` (the default), one process pool serves every request: items go straight to
    its queue with the request's ``scorer_kwargs``, so concurrent requests share the workers and
    each item's timeout counts from when a worker starts it. Other managers get one instance
    per distinct ``scorer_kwargs`` (at most ``MAX_KWARGS_VARIANTS``), one batch at a time.
    """

    def __init__(self, config: RewardConfig):
        # The server reports failures as typed errors; the client applies its own failure policy.
        self.config = replace(config, failure_policy="mask", progress=False)
        self._managers: dict[str, tuple[RewardManager, asyncio.Lock]] = {}
        self._creating = asyncio.Lock()
        self._counts: Counter = Counter()

    @staticmethod
    def _key(scorer_kwargs: dict) -> str:
        return json.dumps(scorer_kwargs, sort_keys=True, separators=(",", ":"))

    async def start(self) -> None:
        await self._manager(self.config.scorer_kwargs)

    async def _manager(self, scorer_kwargs: dict) -> tuple[RewardManager, asyncio.Lock]:
        async with self._creating:
            if self._managers and self._pool() is not None:  # one pool, kwargs travel with each item
                return next(iter(self._managers.values()))
            key = self._key(scorer_kwargs)
            if key not in self._managers:
                if len(self._managers) >= MAX_KWARGS_VARIANTS:
                    raise ServiceError(400, "bad_request", f"this server already scores with {MAX_KWARGS_VARIANTS} distinct "
                                             "scorer_kwargs; send the same scorer_kwargs with every request")
                cfg = replace(self.config, scorer_kwargs=scorer_kwargs)
                manager = await asyncio.to_thread(make_reward_manager, cfg)
                self._managers[key] = (manager, asyncio.Lock())
            return self._managers[key]

    def _pool(self) -> Any:
        """The prime manager's ScorerPool (``submit(item, override, kwargs) -> Future``), if any."""
        for manager, _ in self._managers.values():
            pool = getattr(manager, "pool", None)
            if callable(getattr(pool, "submit", None)):
                return pool
        return None

    async def score(self, items: list[RewardItem], scorer_kwargs: Optional[dict]) -> list[RewardResult]:
        """Score ``items`` with ``scorer_kwargs`` (None: the server's defaults)."""
        if scorer_kwargs is None:
            scorer_kwargs = self.config.scorer_kwargs
        manager, lock = await self._manager(scorer_kwargs)
        pool = self._pool()
        if pool is not None:
            futures = pool.submit_many(items, None, scorer_kwargs)
            # one thread hand-off per request, not one event-loop wake-up per item
            results = await asyncio.to_thread(lambda: [f.result() for f in futures])
        else:
            async with lock:  # e.g. naive: one batch at a time, or queueing would count against timeouts
                results = await manager.ascore_items(items)
        for r in results:
            self._counts["items"] += 1
            self._counts[f"error/{r.error.type}" if r.error else "ok"] += 1
        return results

    def stats(self) -> dict:
        pool = self._pool()
        return {**self._counts, **({f"pool/{k}": v for k, v in pool.counters.items()}
                                   if pool is not None and hasattr(pool, "counters") else {})}

    async def close(self) -> None:
        managers, self._managers = list(self._managers.values()), {}
        for manager, _ in managers:
            await asyncio.to_thread(manager.close)


_SCORING = web.AppKey("scoring", _Scoring)
_MAX_BYTES = web.AppKey("max_request_bytes", int)


def _check_scorer_kwargs(value: Any) -> Optional[dict]:
    """``{scorer: {kwarg: value}}`` (or None); kwargs a registered scorer cannot take are a ValueError."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise ValueError("'scorer_kwargs' must map scorer names to objects of keyword arguments, "
                         f"got {json.dumps(value)[:200]}")
    for name, kwargs in value.items():
        if name not in SCORERS:
            continue  # like reward.scorer_kwargs: kwargs of a scorer no item uses are ignored
        try:
            inspect.signature(SCORERS[name]).bind("", None, None, **kwargs)
        except TypeError as e:
            raise ValueError(f"scorer_kwargs[{name!r}]: scorer {name!r} cannot take {sorted(kwargs)}: {e}") from None
        except ValueError:  # no signature to check (a builtin): let the call decide
            pass
    return value


async def _health(request: web.Request) -> web.Response:
    scoring = request.app[_SCORING]
    cfg = scoring.config
    return web.json_response({
        "status": "ok", "manager": cfg.manager, "workers": cfg.workers, "timeout_s": cfg.timeout_s,
        "max_request_bytes": request.app[_MAX_BYTES], "scorers": SCORERS.names(), "stats": scoring.stats(),
    })


async def _scorers(request: web.Request) -> web.Response:
    return web.json_response({"scorers": SCORERS.names()})


def parse_score_request(payload: dict) -> tuple[list[RewardItem], Optional[dict]]:
    """A ``POST /score`` body (a JSON object of ``SCORE_REQUEST_KEYS``): its items, with the request's
    ``scorer`` applied to those that name none, and its ``scorer_kwargs`` (None when not given).
    Anything malformed is a ``ServiceError`` naming the item and field. The sandbox service's
    ``/score`` reads its requests with this too."""
    raw_items = payload.get("items")
    if not isinstance(raw_items, list):
        raise ServiceError(400, "bad_request", "'items' must be a list of RewardItem objects, got "
                           f"{type(raw_items).__name__}")
    scorer = payload.get("scorer")
    if scorer is not None and not isinstance(scorer, str):
        raise ServiceError(400, "bad_request", f"'scorer' must be a string or null, got {type(scorer).__name__}")
    if scorer is not None and scorer not in SCORERS:
        raise ServiceError(404, "unknown_scorer", f"unknown scorer {scorer!r}; registered: "
                           f"{', '.join(SCORERS.names())}", scorers=SCORERS.names())
    try:
        scorer_kwargs = _check_scorer_kwargs(payload.get("scorer_kwargs"))
        items = [RewardItem.from_dict(d, where=f"items[{i}]") for i, d in enumerate(raw_items)]
    except (ValueError, TypeError) as e:
        raise ServiceError(400, "bad_request", str(e)) from None
    if scorer is not None:
        for item in items:
            item.scorer = item.scorer or scorer
    return items, scorer_kwargs


async def _score(request: web.Request) -> web.Response:
    limit = request.app[_MAX_BYTES]
    too_large = (f"request body is over this server's limit of {limit} bytes (--max-request-mb); "
                 "send fewer or smaller items per request")
    if request.content_length is not None and request.content_length > limit:
        raise ServiceError(413, "request_too_large", too_large)
    try:
        await request.read()  # read once here (aiohttp keeps it) to answer an oversized body with the limit
    except web.HTTPRequestEntityTooLarge:
        raise ServiceError(413, "request_too_large", too_large) from None
    items, scorer_kwargs = parse_score_request(await read_json_object(request, SCORE_REQUEST_KEYS))
    if not items:
        return web.json_response({"results": []})
    try:
        results = await request.app[_SCORING].score(items, scorer_kwargs)
    except ServiceError:
        raise
    except Exception as e:  # a manager failure, not an item's: the client may retry it
        raise ServiceError(500, "scoring_failed", f"scoring failed: {type(e).__name__}: {e}", retryable=True) from None
    return web.json_response({"results": [r.as_dict() for r in results]})


def make_app(config: Optional[RewardConfig] = None, *, max_request_mb: float = DEFAULT_MAX_REQUEST_MB) -> web.Application:
    """The aiohttp application. Scorer modules are imported now (a bad one is a ConfigError);
    the scoring manager starts with the app and is closed (its workers stopped) on cleanup."""
    config = config or RewardConfig(manager="prime")
    config.validate()
    if max_request_mb <= 0:
        raise ConfigError(f"--max-request-mb must be > 0, got {max_request_mb}")

    REWARD_MANAGERS.get(config.manager)  # an unknown manager is a ConfigError now, not at startup
    import_scorer_modules(config.scorer_modules)
    max_bytes = int(max_request_mb * 2**20)
    app = web.Application(client_max_size=max_bytes, middlewares=[error_middleware()])
    scoring = _Scoring(config)
    app[_SCORING] = scoring
    app[_MAX_BYTES] = max_bytes

    async def start(app: web.Application) -> None:
        await scoring.start()  # start the pool now, not on the first request

    async def stop(app: web.Application) -> None:
        await scoring.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/health", _health)
    app.router.add_get("/scorers", _scorers)
    app.router.add_post("/score", _score)
    return app


@contextlib.asynccontextmanager
async def serve(config: Optional[RewardConfig] = None, host: str = "127.0.0.1", port: int = 0, *,
                max_request_mb: float = DEFAULT_MAX_REQUEST_MB, quiet: bool = True) -> AsyncIterator[str]:
    """Serve in this event loop; yields ``http://host:port`` (the real port when ``port=0``)."""
    async with serve_app(make_app(config, max_request_mb=max_request_mb), host, port, shutdown_timeout=2.0,
                         quiet=quiet) as url:
        yield url


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m verl_agentic.reward.server", description=(
        "Serve the registered reward scorers over HTTP (client: reward.manager=remote reward.url=...)."))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = a free port (printed)")
    p.add_argument("--manager", default="prime", help="prime (process pool, default) | naive (in-process)")
    p.add_argument("--workers", type=int, default=0, help="scoring processes (prime); 0 = one per CPU")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-item limit; <= 0 = none")
    p.add_argument("--memory-limit-mb", type=int, default=4096, help="per worker (prime); <= 0 = none")
    p.add_argument("--max-request-mb", type=float, default=DEFAULT_MAX_REQUEST_MB, help="413 above this body size")
    p.add_argument("--scorer-module", action="extend", nargs="+", default=[], metavar="MODULE",
                   help="import these modules so their scorers register (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no access log")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)

    def start():
        config = RewardConfig(
            manager=args.manager, num_workers=max(args.workers, 0),
            timeout_s=args.timeout_s if args.timeout_s > 0 else None,
            memory_limit_mb=args.memory_limit_mb if args.memory_limit_mb > 0 else None,
            scorer_modules=list(args.scorer_module))
        return serve(config, args.host, args.port, max_request_mb=args.max_request_mb, quiet=args.quiet)

    return run_service("reward server", start)


if __name__ == "__main__":
    sys.exit(main())
