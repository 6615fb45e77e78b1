"""The service toolkit (``verl_agentic.serving``): one error shape on both ends of the wire, one
middleware, one JSON body reader, one client transport with its retry policy, one helper-thread
loop. Every server here is real (aiohttp on loopback); the faults are answers a real server gives.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter

import aiohttp
import pytest
from aiohttp import web

from verl_agentic.envserver.server import serve as serve_env
from verl_agentic.interfaces import ConfigError
from verl_agentic.reward.base import RewardConfig
from verl_agentic.reward.server import serve as serve_reward
from verl_agentic.sandbox.server import ServiceConfig
from verl_agentic.sandbox.server import serve as serve_sandbox
from verl_agentic.serving import (
    BackgroundLoop,
    HttpTransport,
    ServiceError,
    error_from_answer,
    error_middleware,
    read_json_object,
    serve_app,
)

FAST = dict(max_retries=2, retry_backoff_s=0.01)


class FaultyApp:
    """A real server whose routes answer what the toolkit must handle; ``hits`` counts requests."""

    def __init__(self):
        self.hits: Counter = Counter()
        self.counts: Counter = Counter()
        app = web.Application(middlewares=[error_middleware(self.counts)])
        for path, handler in {"/typed": self.typed, "/flaky": self.flaky, "/crash": self.crash, "/plain500": self.plain500,
                              "/garbage": self.garbage, "/echo": self.echo, "/slow": self.slow}.items():
            app.router.add_route("*", path, handler)
        self.app = app

    async def typed(self, request: web.Request) -> web.Response:
        self.hits["typed"] += 1
        raise ServiceError(409, "key_conflict", "that key is taken", holder="sb-1")

    async def flaky(self, request: web.Request) -> web.Response:
        self.hits["flaky"] += 1
        if self.hits["flaky"] < 3:
            raise ServiceError(503, "shutting_down", "busy", retryable=True)
        return web.json_response({"ok": True})

    async def crash(self, request: web.Request) -> web.Response:
        self.hits["crash"] += 1
        raise KeyError("a bug")

    async def plain500(self, request: web.Request) -> web.Response:
        self.hits["plain500"] += 1
        return web.Response(status=502, text="<html>bad gateway</html>")

    async def garbage(self, request: web.Request) -> web.Response:
        self.hits["garbage"] += 1
        return web.Response(text="not json")

    async def echo(self, request: web.Request) -> web.Response:
        return web.json_response(await read_json_object(request, ("a", "b")))

    async def slow(self, request: web.Request) -> web.Response:
        self.hits["slow"] += 1
        await asyncio.sleep(5)
        return web.json_response({})


async def test_the_service_error_crosses_the_wire_unchanged():
    faulty = FaultyApp()
    async with serve_app(faulty.app) as url, HttpTransport(url, name="t", **FAST) as http:
        with pytest.raises(ServiceError) as e:
            await http.request("POST", "/typed", json_body={})
        err = e.value
        assert (err.status, err.type, err.message, err.retryable, err.extra) == \
            (409, "key_conflict", "that key is taken", False, {"holder": "sb-1"})
        assert faulty.hits["typed"] == 1 and http.counts["retries"] == 0  # not retryable: asked once
        assert faulty.counts["http_409"] == 1


async def test_middleware_answers_every_failure_in_the_shape():
    faulty = FaultyApp()
    async with serve_app(faulty.app) as url, aiohttp.ClientSession() as s:
        async def raw(method, path, **kw):
            async with s.request(method, url + path, **kw) as r:
                return error_from_answer(r.status, await r.read())

        assert (await raw("GET", "/nowhere")).type == "not_found"
        crash = await raw("GET", "/crash")
        assert (crash.status, crash.type, crash.retryable) == (500, "internal_error", True)
        assert "KeyError" in crash.message
        bad = await raw("POST", "/echo", data=b"{nope")
        assert (bad.status, bad.type) == (400, "bad_request") and "not valid JSON" in bad.message
        assert "got list" in (await raw("POST", "/echo", json=[1])).message
        unknown = await raw("POST", "/echo", json={"a": 1, "c": 2})
        assert unknown.message == "unknown fields ['c']; known: ['a', 'b']"
        async with s.post(url + "/echo", json={"a": 1}) as r:
            assert r.status == 200 and await r.json() == {"a": 1}


async def test_retry_policy():
    faulty = FaultyApp()
    async with serve_app(faulty.app) as url, HttpTransport(url, name="t", **FAST) as http:
        # a typed error marked retryable is retried until it succeeds
        assert await http.request("GET", "/flaky") == {"ok": True}
        assert faulty.hits["flaky"] == 3 and http.counts["retries"] == 2
        # an untyped 5xx (a proxy) is retried for an idempotent request, not for another
        with pytest.raises(ServiceError) as e:
            await http.request("POST", "/plain500", json_body={})
        assert (e.value.type, e.value.status) == ("service_unavailable", 502)
        assert "gave up after 3 attempts" in e.value.message and faulty.hits["plain500"] == 3
        with pytest.raises(ServiceError) as e:
            await http.request("POST", "/plain500", json_body={}, idempotent=False)
        assert faulty.hits["plain500"] == 4 and "gave up" not in e.value.message
        # a crash is retryable: retried
        with pytest.raises(ServiceError) as e:
            await http.request("GET", "/crash")
        assert e.value.type == "internal_error" and faulty.hits["crash"] == 3
        # not JSON, or failing the caller's check: bad_response, retried
        with pytest.raises(ServiceError) as e:
            await http.request("GET", "/garbage")
        assert e.value.type == "bad_response" and faulty.hits["garbage"] == 3
        with pytest.raises(ServiceError) as e:
            await http.request("POST", "/echo", json_body={"a": 1}, check=lambda a: None if "b" in a else "no b")
        assert e.value.type == "bad_response" and "malformed answer: no b" in e.value.message
        # no answer in time
        with pytest.raises(ServiceError) as e:
            await http.request("GET", "/slow", timeout_s=0.2, max_retries=0)
        assert (e.value.type, e.value.status) == ("timeout", None) and "no answer within 0.2 s" in e.value.message
        assert http.counts["failed_requests"] == 6


async def test_a_refused_connection_is_retried_even_when_not_idempotent():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with HttpTransport(f"http://127.0.0.1:{port}", name="gone", **FAST) as http:
        with pytest.raises(ServiceError) as e:
            await http.request("POST", "/x", json_body={}, idempotent=False)
    assert e.value.type == "service_unavailable" and e.value.status is None
    assert e.value.message.startswith(f"gone http://127.0.0.1:{port}/x: cannot reach the server")
    assert "gave up after 3 attempts" in e.value.message and http.counts["requests"] == 3


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="t url must look like http://host:port"):
        HttpTransport("localhost:80", name="t")
    with pytest.raises(ConfigError, match="max_retries an integer >= 0"):
        HttpTransport("http://h:1", name="t", max_retries=-1)


async def test_the_three_services_answer_in_one_shape():
    """The environment, sandbox and reward services: the same bad request, the same error shape."""
    async with serve_env() as env, serve_sandbox(ServiceConfig()) as sandbox, \
            serve_reward(RewardConfig(manager="naive")) as reward, aiohttp.ClientSession() as s:
        for url in (f"{env}/start", f"{sandbox}/sandboxes", f"{reward}/score"):
            async with s.post(url, data=b"[1, 2]") as r:
                answer = await r.json()
            assert r.status == 400 and set(answer) == {"error"}, (url, answer)
            assert (answer["error"]["type"], answer["error"]["retryable"]) == ("bad_request", False), url
            assert "must be a JSON object" in answer["error"]["message"], url
            async with s.get(url.rsplit("/", 1)[0] + "/nowhere") as r:
                assert error_from_answer(r.status, await r.read()).type == "not_found", url


def test_background_loop_runs_coroutines_from_any_thread_and_closes():
    loop = BackgroundLoop("test-loop")
    assert not loop.started

    async def where() -> str:
        return threading.current_thread().name

    assert loop.run(where()) == "test-loop"
    results = []
    threads = [threading.Thread(target=lambda: results.append(loop.run(where()))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["test-loop"] * 4
    finals = []

    async def final():
        finals.append(threading.current_thread().name)

    thread = loop._thread
    loop.close(final)
    assert finals == ["test-loop"] and not thread.is_alive() and not loop.started
    assert loop.run(where()) == "test-loop"  # usable again: a fresh loop
    loop.close()


def test_background_loop_stops_even_when_the_final_coroutine_raises():
    loop = BackgroundLoop("test-loop-2")

    async def noop():
        return 1

    assert loop.run(noop()) == 1
    thread = loop._thread

    async def broken():
        raise OSError("closing failed")

    with pytest.raises(OSError, match="closing failed"):
        loop.close(broken)
    assert not thread.is_alive() and not loop.started
