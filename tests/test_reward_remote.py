"""The reward server and its client (``swedev``), over real loopback HTTP.

Servers are real: ``python -m verl_agentic.reward.server`` subprocesses (killed with SIGKILL and
restarted on the same port for the crash test) or in-process ``serve()``. Transport faults come
from ``FaultInjectingProxy``, a real aiohttp server in front of a real reward server that answers
500, garbage, truncated JSON, the wrong number of results, nothing at all, or drops the
connection for its first K requests, then forwards.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web

from verl_agentic.interfaces import ConfigError
from verl_agentic.reward.base import RewardConfig, RewardItem, make_reward_manager
from verl_agentic.reward.server import serve

from va_services import LoopbackProxy, ServiceProcess

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SERVER_TIMEOUT_S = 1.0
SERVER_WORKERS = 2
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)
FAST_RETRIES = dict(max_retries=4, retry_backoff_s=0.02)


# -- helpers ---------------------------------------------------------------------------------------
class ServerProcess(ServiceProcess):
    """``python -m verl_agentic.reward.server`` as a real subprocess, in its own process group."""

    def __init__(self, port: int = 0, *args: str):
        super().__init__("verl_agentic.reward.server", "--workers", str(SERVER_WORKERS), "--timeout-s",
                         str(SERVER_TIMEOUT_S), "--scorer-module", "va_faulty_scorers", "--quiet", *args,
                         ready="reward server listening on ", port=port)


def _kill_leftovers(procs: list[psutil.Process]) -> list[int]:
    """SIGKILL those of ``procs`` still alive (by pid); the pids that were."""
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
                p.kill()
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess()
    yield srv
    workers = srv.descendants()
    assert srv.stop() == 0
    assert not _kill_leftovers(workers), "worker processes outlived the server's SIGTERM shutdown"


def gsm8k_items() -> list[RewardItem]:
    """A mix: right, wrong, well-formed wrong, unparseable, the openai/gsm8k alias, task_type only."""
    items = []
    for i in range(12):
        truth = str(10 + i)
        text = [f"so the answer is #### {truth}", f"#### {int(truth) + 1}", f"I think {truth}",
                "no idea", f"{truth} apples, or maybe 3"][i % 5]
        ds = ["gsm8k", "openai/gsm8k", None][i % 3]
        items.append(RewardItem(text, truth, data_source=ds, task_type=None if ds else "gsm8k",
                                extra_info={"index": i}))
    return items


def naive_results(items, **cfg):
    with make_reward_manager(RewardConfig(manager="naive", scorer_modules=["va_faulty_scorers"], **cfg)) as m:
        return m.score_items(items)


def swedev(url: str, **cfg):
    return make_reward_manager(RewardConfig(manager="swedev", url=url, **{**FAST_RETRIES, **cfg}))


def as_tuples(results):
    return [(r.score, r.extra, r.error.as_dict() if r.error else None) for r in results]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultInjectingProxy(LoopbackProxy):
    """A real HTTP server in front of ``upstream``: its first ``faulty`` ``POST /score`` requests get
    ``mode``, later ones are forwarded. ``GET`` requests are forwarded (or 404 with ``health=False``).

    Modes: ``500``, ``garbage`` (200 with non-JSON bytes), ``truncated`` (the real answer cut in
    half), ``wrong_count`` (the real answer less its last result), ``not_object`` (200 ``[]``),
    ``drop`` (the connection closed without an answer), ``stall`` (no answer for 30 s).
    """

    def __init__(self, upstream: str, mode: str = "500", faulty: float = 0, health: bool = True):
        super().__init__(upstream)
        self.mode, self.faulty, self.health = mode, faulty, health
        self.score_requests = 0
        self.in_flight = self.max_in_flight = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            if not self.health:
                return web.json_response({"error": "no health here"}, status=404)
            return await self.forward_response(request)
        self.score_requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request, faulty=self.score_requests <= self.faulty)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, faulty: bool) -> web.StreamResponse:
        mode = self.mode if faulty else None
        if mode == "500":
            return web.json_response({"error": "injected internal error"}, status=500)
        if mode == "garbage":
            return web.Response(body=b"\x00\xffthis is not JSON", content_type="application/json")
        if mode == "not_object":
            return web.json_response([])
        if mode == "drop":
            await request.read()
            request.transport.close()
            return web.Response()
        if mode == "stall":
            await asyncio.sleep(30)
        status, body = await self.forward(request)
        if mode == "truncated":
            body = body[: len(body) // 2]
        elif mode == "wrong_count":
            payload = json.loads(body)
            payload["results"] = payload["results"][:-1]
            body = json.dumps(payload).encode()
        return web.Response(status=status, body=body, content_type="application/json")


# -- the server ------------------------------------------------------------------------------------
async def test_health_and_scorers_endpoints(server):
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
        async with s.get(server.url + "/health") as r:
            assert r.status == 200
            health = await r.json()
        async with s.get(server.url + "/scorers") as r:
            scorers = (await r.json())["scorers"]
    assert health["status"] == "ok" and health["manager"] == "prime" and health["workers"] == SERVER_WORKERS
    assert health["timeout_s"] == SERVER_TIMEOUT_S and health["max_request_bytes"] == 64 * 2**20
    assert {"gsm8k", "openai/gsm8k", "faulty"} <= set(health["scorers"]) and scorers == health["scorers"]


async def test_bad_requests_get_clear_4xx(server):
    good = {"solution_str": "#### 1", "ground_truth": "1", "data_source": "gsm8k"}
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"items": {"a": 1}}).encode(), 400, "'items' must be a list"),
        (json.dumps({"items": [good, {"ground_truth": "1"}]}).encode(), 400, "items[1]: field 'solution_str'"),
        (json.dumps({"items": [good, good, {**good, "extra_info": [1]}]}).encode(), 400, "items[2]: field 'extra_info'"),
        (json.dumps({"items": [{**good, "colour": "red"}]}).encode(), 400, "items[0]: unknown fields ['colour']"),
        (json.dumps({"items": [good], "scorer_kwargs": {"gsm8k": 3}}).encode(), 400, "'scorer_kwargs' must map"),
        (json.dumps({"items": [good], "scorer_kwargs": {"gsm8k": {"bogus": 1}}}).encode(), 400, "'bogus'"),
        (json.dumps({"items": [good], "scorer": "gsm9k"}).encode(), 404, "unknown scorer 'gsm9k'; registered: faulty"),
    ]
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
        for body, status, message in cases:
            async with s.post(server.url + "/score", data=body) as r:
                answer = await r.json()
                assert (r.status, message in answer["error"]["message"]) == (status, True), (body[:80], answer)
        async with s.post(server.url + "/score", json={"items": [good], "scorer": "gsm9k"}) as r:
            assert "gsm8k" in (await r.json())["error"]["scorers"]
        # a request-level scorer applies to the items that name none
        async with s.post(server.url + "/score", json={"items": [{"solution_str": "#### 2", "ground_truth": "2"}],
                                                        "scorer": "gsm8k"}) as r:
            assert r.status == 200 and (await r.json())["results"][0]["score"] == 1.0


async def test_oversized_body_is_413_and_client_marks_only_that_item():
    async with serve(RewardConfig(manager="prime", num_workers=1, timeout_s=5), max_request_mb=0.25) as url:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            async with s.post(url + "/score", data=b'{"items": ["' + b"x" * 2**20 + b'"]}') as r:
                assert r.status == 413
                assert "limit of 262144 bytes" in (await r.json())["error"]["message"]

            async def chunks():  # no Content-Length: the limit applies while reading
                for _ in range(8):
                    yield b"x" * 2**16

            async with s.post(url + "/score", data=chunks()) as r:
                assert r.status == 413 and "limit of 262144 bytes" in (await r.json())["error"]["message"]
        items = [RewardItem("#### 3", "3", "gsm8k"), RewardItem("#### 3 " + "y" * 300_000, "3", "gsm8k"),
                 RewardItem("#### 4", "3", "gsm8k")]
        m = swedev(url)
        results = await m.ascore_items(items)
        assert [r.score for r in results] == [1.0, None, 0.0]
        assert results[1].error.type == "request_too_large" and "262144" in results[1].error.message
        # a client that cannot read the limit (no /health) learns it from 413s: it halves the batch
        big = [RewardItem(f"#### {i} " + "z" * 40_000, str(i), "gsm8k") for i in range(12)]  # ~480 KB in all
        async with FaultInjectingProxy(url, health=False) as proxy_url:
            results = await swedev(proxy_url).ascore_items(big + items[1:2])
        assert [r.score for r in results[:-1]] == [1.0] * 12
        assert results[-1].error.type == "request_too_large"


# -- the client against a healthy server -----------------------------------------------------------
def test_scores_identical_to_naive_sync_client(server):
    items = gsm8k_items()
    kwargs = {"gsm8k": {"format_score": 0.25}}
    expected = naive_results(items, scorer_kwargs=kwargs)
    with swedev(server.url, batch_size=5, concurrency=2, scorer_kwargs=kwargs) as m:
        got = m.score_items(items)
        assert as_tuples(got) == as_tuples(expected)
        assert {r.score for r in got} == {0.0, 0.25, 1.0}  # the kwargs reached the server
        assert m.stats()["requests"] == 3 and m.stats()["retries"] == 0 and m.stats()["ok"] == 12
        # the default request timeout: server timeout * ceil(concurrency * n / server workers) + 10
        assert m.request_timeout(5) == SERVER_TIMEOUT_S * math.ceil(2 * 5 / SERVER_WORKERS) + 10


async def test_sync_client_inside_a_running_event_loop(server):
    items = gsm8k_items()[:4]
    with swedev(server.url) as m:
        assert as_tuples(m.score_items(items)) == as_tuples(naive_results(items))


async def test_forced_scorer_and_unknown_scorer_per_item(server):
    items = [RewardItem("#### 5", "5", "gsm8k"), RewardItem("#### 5", "5", data_source="nope"),
             RewardItem("#### 5", "5", scorer="gsm9k")]
    results = await swedev(server.url).ascore_items(items)
    assert results[0].score == 1.0
    for r in results[1:]:
        assert r.score is None and r.error.type == "unknown_scorer" and "registered: faulty" in r.error.message
    # reward.scorer applies to every item that names none, as with naive
    forced = await swedev(server.url, scorer="faulty").ascore_items(
        [RewardItem("#### 5", "5", "nope", extra_info={"fault": "nan"}), RewardItem("#### 5", "5", "nope")])
    assert forced[0].error.type == "invalid_score" and forced[1].score == 1.0


async def test_faulty_scorers_get_typed_errors_and_the_rest_is_scored(server):
    faults = ["raise", "hang", "nan", "string", "none", "dict_without_score", "spin", None]
    items = [RewardItem("#### 7", "7", extra_info={"fault": f} if f else {}, scorer="faulty") for f in faults]
    items += gsm8k_items()[:4]
    m = swedev(server.url, batch_size=4, failure_policy="zero")
    t0 = time.monotonic()
    results = await m.ascore_items(items)
    elapsed = time.monotonic() - t0
    types = [r.error.type if r.error else None for r in results[:8]]
    assert types == ["scorer_error", "timeout", "invalid_score", "invalid_score", "invalid_score",
                     "invalid_score", "timeout", None]
    assert "exploded on purpose" in results[0].error.message
    assert all(r.score == 0.0 for r in results[:7]) and results[7].score == 1.0
    assert as_tuples(results[8:]) == as_tuples(naive_results(items[8:]))
    assert elapsed < 10, f"two 1 s timeouts took {elapsed:.1f} s"
    assert m.stats()["error/timeout"] == 2 and m.stats()["retries"] == 0


async def test_megabyte_strings_are_scored_and_split_by_bytes(server):
    one_mb = "word " * (2**20 // 5)
    items = [RewardItem(one_mb + f"#### {i}", str(i), "gsm8k") for i in range(20)]  # ~21 MB in all
    m = swedev(server.url, batch_size=64)
    results = await m.ascore_items(items)
    assert [r.score for r in results] == [1.0] * 20
    assert [r.extra["pred"] for r in results] == [str(i) for i in range(20)]
    assert m.stats()["requests"] == 2  # over the 16 MB body budget, under 64 items


# -- faults ----------------------------------------------------------------------------------------
def test_server_killed_mid_batch_and_restarted(server):
    first = ServerProcess()
    port = first.port
    items = [RewardItem(f"#### {i}", str(i), scorer="faulty", extra_info={"fault": "sleep", "sleep_s": 0.15})
             for i in range(24)]
    m = swedev(first.url, batch_size=2, concurrency=2, max_retries=12, retry_backoff_s=0.1)
    box: dict = {}
    client = threading.Thread(target=lambda: box.setdefault("results", m.score_items(items)))
    workers: list[psutil.Process] = []
    try:
        client.start()
        time.sleep(0.8)  # 24 items x 0.15 s over 2 workers take ~1.8 s: the batch is under way
        assert client.is_alive()
        workers = first.descendants()
        first.kill()
        time.sleep(0.5)
        second = ServerProcess(port)
        workers += second.descendants()
        client.join(60)
        assert not client.is_alive()
        results = box["results"]
        assert [r.score for r in results] == [1.0] * 24, [r.error for r in results if r.error]
        stats = m.stats()
        assert stats["retries"] >= 1 and stats["requests"] > 12 and stats["failed_requests"] == 0
        workers += second.descendants()
        assert second.stop() == 0
    finally:
        m.close()
        first.kill()
        _kill_leftovers(workers)


@pytest.mark.parametrize("mode", ["500", "drop", "stall"])
async def test_unavailable_server_recovers(server, mode):
    items = gsm8k_items()
    direct = await swedev(server.url).ascore_items(items)
    async with FaultInjectingProxy(server.url, mode, faulty=3) as url:
        m = swedev(url, batch_size=64, concurrency=1, request_timeout_s=0.5 if mode == "stall" else None)
        assert as_tuples(await m.ascore_items(items)) == as_tuples(direct)
    assert m.stats()["retries"] == 3 and m.stats()["requests"] == 4 and m.stats()["failed_requests"] == 0


@pytest.mark.parametrize("mode", ["garbage", "truncated", "wrong_count", "not_object"])
async def test_malformed_answers_are_retried(server, mode):
    items = gsm8k_items()
    direct = await swedev(server.url).ascore_items(items)
    async with FaultInjectingProxy(server.url, mode, faulty=2) as url:
        m = swedev(url, batch_size=64)
        assert as_tuples(await m.ascore_items(items)) == as_tuples(direct)
    assert m.stats()["retries"] == 2 and m.stats()["failed_requests"] == 0


@pytest.mark.parametrize("mode,policy,error", [("500", "mask", "service_unavailable"),
                                               ("500", "zero", "service_unavailable"),
                                               ("garbage", "mask", "bad_response"),
                                               ("wrong_count", "zero", "bad_response")])
async def test_proxy_that_never_recovers_gives_typed_errors(server, mode, policy, error):
    items = gsm8k_items()
    proxy = FaultInjectingProxy(server.url, mode, faulty=math.inf)
    async with proxy as url:
        m = swedev(url, batch_size=5, concurrency=2, max_retries=2, retry_backoff_s=0.01, failure_policy=policy)
        results = await m.ascore_items(items)
    assert all(r.error is not None and r.error.type == error for r in results)
    assert all(r.score == (None if policy == "mask" else 0.0) for r in results)
    assert "gave up after 3 attempts" in results[0].error.message
    stats = m.stats()
    assert stats["requests"] == 9 and stats["retries"] == 6 and stats["failed_requests"] == 3
    assert stats[f"error/{error}"] == 12 and proxy.score_requests == 9


async def test_concurrency_bounds_requests_in_flight(server):
    items = [RewardItem(f"#### {i}", str(i), scorer="faulty", extra_info={"fault": "sleep", "sleep_s": 0.1})
             for i in range(8)]
    proxy = FaultInjectingProxy(server.url)
    async with proxy as url:
        results = await swedev(url, batch_size=1, concurrency=2).ascore_items(items)
    assert [r.score for r in results] == [1.0] * 8
    assert proxy.score_requests == 8 and proxy.max_in_flight == 2


async def test_service_down_from_the_start():
    url = f"http://127.0.0.1:{free_port()}"
    m = swedev(url, batch_size=4, max_retries=3, retry_backoff_s=0.05)
    t0 = time.monotonic()
    results = await m.ascore_items(gsm8k_items())
    assert time.monotonic() - t0 < 5
    assert all(r.score is None and r.error.type == "service_unavailable" for r in results)
    assert "cannot reach" in results[0].error.message and "after 4 attempts" in results[0].error.message
    assert m.stats()["failed_requests"] == 3 and m.stats()["requests"] == 12


def test_client_config_errors():
    with pytest.raises(ConfigError, match="reward.url is required"):
        make_reward_manager(RewardConfig(manager="swedev"))
    with pytest.raises(ConfigError, match="http://host:port"):
        make_reward_manager(RewardConfig(manager="swedev", url="localhost:8000"))
    with pytest.raises(ConfigError, match="batch_size"):
        make_reward_manager(RewardConfig(manager="swedev", url="http://x:1", batch_size=0))
    m = make_reward_manager(RewardConfig(manager="remote", url="http://x:1", scorer_modules=["only_on_the_server"]))
    assert m.name == "remote" and m.score_items([]) == []
    with pytest.raises(ConfigError, match="reward.url is required for reward.manager=remote"):
        make_reward_manager(RewardConfig(manager="remote"))


def test_swedev_is_an_alias_of_remote_and_reports_the_name_it_was_selected_by():
    old = make_reward_manager(RewardConfig(manager="swedev", url="http://x:1"))
    new = make_reward_manager(RewardConfig(manager="remote", url="http://x:1"))
    assert type(old) is type(new) and (old.name, new.name) == ("swedev", "remote")
    assert make_reward_manager(RewardConfig(manager="naive")).name == "naive"


def test_server_cli_sigterm_stops_workers_and_bad_module_fails_fast(server):
    srv = ServerProcess()
    with swedev(srv.url) as m:
        assert m.score_items([RewardItem("#### 1", "1", "gsm8k")])[0].score == 1.0
    workers = srv.descendants()
    assert len(workers) >= SERVER_WORKERS
    assert srv.stop() == 0
    time.sleep(0.2)
    assert not _kill_leftovers(workers)
    bad = subprocess.run([sys.executable, "-m", "verl_agentic.reward.server", "--port", "0", "--scorer-module",
                          "no_such_scorer_module"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cannot import 'no_such_scorer_module'" in bad.stderr


async def test_naive_server_keeps_one_manager_per_scorer_kwargs():
    items = [RewardItem("#### 8", "9", "gsm8k"), RewardItem("#### 9", "9", "gsm8k")]
    async with serve(RewardConfig(manager="naive", timeout_s=5)) as url:
        plain = await swedev(url).ascore_items(items)
        partial = await swedev(url, scorer_kwargs={"gsm8k": {"format_score": 0.5}}).ascore_items(items)
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            async with s.get(url + "/health") as r:
                health = await r.json()
    assert [r.score for r in plain] == [0.0, 1.0] and [r.score for r in partial] == [0.5, 1.0]
    assert health["manager"] == "naive" and health["stats"] == {"items": 4, "ok": 4}
