"""The environment service (``python -m verl_agentic.envserver``) and its client, over real loopback HTTP:
the protocol on real tasks (gsm8k feedback, tool_agent with the calculator), idempotent retries,
typed errors, session reaping, shutdown, and the client's retries against a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Optional

import aiohttp
import pytest
from aiohttp import web

from verl_agentic.envserver import EnvClient, EnvService, EnvServiceError, serve
from verl_agentic.envserver.server import assistant_text
from verl_agentic.interfaces import EpisodeFailure, EpisodeResult, EpisodeState, Observation
from verl_agentic.tasks import TaskSpec, register_task

from va_services import LoopbackProxy, ServiceProcess
from va_testing import REPO

ENDED: list[tuple[str, Optional[dict]]] = []  # (uid, error) of every _t_env episode whose end() ran


def _start(row, ctx):
    if row.get("start_fails"):
        raise EpisodeFailure("tool_error", "no sandbox for you")
    return EpisodeState(row=row, messages=[dict(m) for m in row["prompt"]], ctx=ctx)


async def _obs(state, out):
    mode = state.row.get("obs")
    if mode == "raise":
        raise RuntimeError("environment exploded")
    if mode == "sleep":
        await asyncio.sleep(30)
    return Observation(messages=[{"role": "user", "content": f"seen: {out.text}"}], turn_reward=0.5,
                       done=state.num_turns >= 2, metrics={"obs_calls": float(state.num_turns)})


def _end(state):
    ENDED.append((state.row["uid"], state.error.as_dict() if state.error else None))
    return EpisodeResult(reward=float(state.num_turns), metrics={"finish": 1.0})


register_task("_t_env", TaskSpec(start=_start, obs=_obs, end=_end), replace=True)


def _row(uid, **extra):
    return {"uid": uid, "prompt": [{"role": "user", "content": "hello"}], "reward_model": {"ground_truth": "4"},
            **extra}


def _gsm8k_row():
    return {"uid": "g", "data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}],
            "reward_model": {"ground_truth": "4"}}


async def _post(url, path, body, raw: Optional[bytes] = None):
    async with aiohttp.ClientSession() as s:
        async with s.post(url + path, data=raw if raw is not None else json.dumps(body)) as r:
            return r.status, await r.json()


def _msg(content, **extra):
    return {"role": "assistant", "content": content, **extra}


async def test_gsm8k_feedback_over_the_protocol():
    async with serve(EnvService(task_configs={"gsm8k": {"feedback": "retry"}})) as url:
        status, start = await _post(url, "/start", {"task_type": "gsm8k", "row": _gsm8k_row(), "max_turns": 3,
                                                    "task_config": {"feedback": "verify"}})
        assert status == 200 and start["messages"] == _gsm8k_row()["prompt"] and start["tools"] is None
        sid = start["session_id"]
        status, wrong = await _post(url, "/step", {"session_id": sid, "turn": 1, "message": _msg("#### 5")})
        assert status == 200 and wrong["done"] is False and wrong["turn_reward"] == 0.0 and wrong["info"] == {"answer": "5"}
        assert wrong["messages"][0]["role"] == "user" and "Are you sure?" in wrong["messages"][0]["content"]
        status, right = await _post(url, "/step", {"session_id": sid, "turn": 2, "message": _msg("2+2 = #### 4")})
        assert status == 200 and right == {"messages": [], "done": True, "turn_reward": 1.0, "metrics": {},
                                         "info": {"answer": "4"}}  # the monitors read each turn's answer
        status, end = await _post(url, "/end", {"session_id": sid, "finish_reason": "stop"})
        assert status == 200 and end["reward"] == 1.0
        assert end["metrics"]["flips_wrong_to_right"] == 1.0 and end["metrics"]["feedback_turns"] == 1.0
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                health = await r.json()
        assert health["status"] == "ok" and "gsm8k" in health["tasks"] and health["sessions"] == 0
        assert health["stats"]["steps"] == 2 and health["stats"]["sessions_ended"] == 1


async def test_tool_calls_reach_the_task_in_its_parser_format_and_answers_keep_call_ids():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "calculator",
                                                              "arguments": json.dumps({"expression": "6*7"})}},
             {"id": "call_b", "type": "function", "function": {"name": "calculator",
                                                              "arguments": {"expression": "2**10"}}}]
    text = assistant_text(_msg("Let me compute.", tool_calls=calls), "hermes")
    assert text == ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n'
                    '</tool_call>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2**10"}}\n'
                    "</tool_call>")
    assert assistant_text(_msg(None), "hermes") == ""
    async with serve(EnvService()) as url:
        client = EnvClient(url)
        start = await client.start("tool_agent", _row("t"), session_id="s1", max_turns=3,
                                   task_config={"tools": ["calculator"]})
        assert [t["function"]["name"] for t in start["tools"]] == ["calculator"]
        step = await client.step("s1", 1, _msg("Let me compute.", tool_calls=calls))
        assert [(m["role"], m["content"], m["tool_call_id"]) for m in step["messages"]] == \
            [("tool", "42", "call_a"), ("tool", "1024", "call_b")]
        assert step["info"] == {"tool_calls": [{"name": "calculator", "status": "ok"}] * 2}  # this turn's calls
        done = await client.step("s1", 2, _msg("The answer is 42."))
        assert done["done"] is True and done["messages"] == [] and done["info"] == {}
        end = await client.end("s1")
        assert end["metrics"]["tool_calls"] == 2.0 and end["metrics"]["tool_ok"] == 2.0
        await client.close()


async def test_every_call_is_idempotent_so_retries_are_safe():
    service = EnvService()
    async with serve(service) as url:
        body = {"task_type": "_t_env", "row": _row("idem"), "session_id": "same", "max_turns": 3}
        first, second = await asyncio.gather(_post(url, "/start", body), _post(url, "/start", body))
        assert first == second and first[0] == 200 and len(service.sessions) == 1
        step = {"session_id": "same", "turn": 1, "message": _msg("hi")}
        a, b = await asyncio.gather(_post(url, "/step", step), _post(url, "/step", step))  # concurrent repeat
        c = await _post(url, "/step", step)  # a late repeat
        assert a == b == c and a[1]["metrics"] == {"obs_calls": 1.0}
        assert service.counts["steps"] == 1 and service.counts["step_repeats"] == 2
        assert service.sessions["same"].state.messages[-1]["content"] == "seen: hi"
        end1 = await _post(url, "/end", {"session_id": "same"})
        end2 = await _post(url, "/end", {"session_id": "same"})
        assert end1 == end2 and end1[0] == 200 and sum(u == "idem" for u, _ in ENDED) == 1
        status, err = await _post(url, "/start", body)  # an ended session cannot start again
        assert status == 409 and err["error"]["type"] == "out_of_order"


async def test_typed_errors():
    async with serve(EnvService(max_sessions=2)) as url:
        cases = [
            ("/start", None, b"{not json", 400, "bad_request", "not valid JSON"),
            ("/start", [1], None, 400, "bad_request", "must be a JSON object"),
            ("/start", {"task_type": "nope", "row": {}}, None, 404, "unknown_task", "registered: "),
            ("/start", {"task_type": "gsm8k", "row": _gsm8k_row(), "task_config": {"feedbak": "x"}}, None,
             400, "bad_request", "unknown task.gsm8k keys ['feedbak']"),
            ("/start", {"task_type": "_t_env", "row": _row("f", start_fails=True)}, None, 500, "tool_error",
             "start: no sandbox for you"),
            ("/step", {"session_id": "ghost", "turn": 1, "message": _msg("x")}, None, 404, "unknown_session",
             "was never started on this service"),
            ("/end", {"session_id": 7}, None, 400, "bad_request", "'session_id' (a string)"),
        ]
        for path, body, raw, status, type_, text in cases:
            got_status, got = await _post(url, path, body, raw)
            assert got_status == status and got["error"]["type"] == type_, (path, got)
            assert text in got["error"]["message"] and got["error"]["retryable"] is False
        _, s1 = await _post(url, "/start", {"task_type": "_t_env", "row": _row("r", obs="raise")})
        sid = s1["session_id"]
        status, err = await _post(url, "/step", {"session_id": sid, "turn": 2, "message": _msg("x")})
        assert status == 409 and "turn 2 after turn 0; expected 1" in err["error"]["message"]
        status, err = await _post(url, "/step", {"session_id": sid, "turn": 1, "message": _msg("x")})
        assert status == 500 and err["error"] == {"type": "task_error", "retryable": False,
                                                  "message": "obs: RuntimeError: environment exploded"}
        again = await _post(url, "/step", {"session_id": sid, "turn": 1, "message": _msg("x")})
        assert again == (status, err)  # a retry gets the same error; obs did not run twice
        await _post(url, "/start", {"task_type": "_t_env", "row": _row("r2")})
        status, err = await _post(url, "/start", {"task_type": "_t_env", "row": _row("r3")})
        assert status == 429 and err["error"]["type"] == "too_many_sessions"
        status, end = await _post(url, "/end", {"session_id": sid, "error": {"type": "task_error", "message": "m"}})
        assert status == 200 and ENDED[-1] == ("r", {"type": "task_error", "message": "m"})


async def test_hung_hooks_time_out_and_idle_sessions_are_reaped():
    service = EnvService(hook_timeout_s=0.3, session_ttl_s=0.2)
    async with serve(service) as url:
        client = EnvClient(url, max_retries=0)
        await client.start("_t_env", _row("slow", obs="sleep"), session_id="slow")
        t0 = time.perf_counter()
        with pytest.raises(EnvServiceError) as e:
            await client.step("slow", 1, _msg("x"))
        assert e.value.type == "timeout" and e.value.status == 504 and time.perf_counter() - t0 < 5
        assert "hook timeout of 0.3 s" in e.value.message
        await client.start("_t_env", _row("idle"), session_id="idle")
        for _ in range(100):  # the reaper runs every ttl/4
            if "idle" not in service.sessions and "slow" not in service.sessions:
                break
            await asyncio.sleep(0.05)
        assert ("idle", {"type": "timeout", "message": "the environment service reaped the session after 0.2 s idle"}) \
            in ENDED
        with pytest.raises(EnvServiceError, match="was reaped after 0.2 s without requests") as e:
            await client.step("idle", 1, _msg("x"))
        assert e.value.type == "unknown_session" and service.counts["sessions_reaped"] == 2
        await client.close()


async def test_shutdown_ends_live_sessions():
    async with serve(EnvService()) as url:
        client = EnvClient(url)
        await client.start("_t_env", _row("live"), session_id="live")
        await client.close()
    assert ENDED[-1] == ("live", {"type": "cancelled", "message": "the environment service shut down"})


class FaultProxy(LoopbackProxy):
    """A real HTTP server in front of ``upstream`` that answers the first ``times`` requests to ``path``
    with ``mode`` (``500``: an untyped 500, ``garbage``: 200 with non-JSON, ``hang``: no answer), then forwards."""

    shutdown_timeout = 0.2

    def __init__(self, upstream: str, path: str, mode: str, times: float):
        super().__init__(upstream)
        self.path, self.mode, self.times = path, mode, times
        self.seen = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == self.path:
            self.seen += 1
            if self.seen <= self.times:
                if self.mode == "500":
                    return web.Response(status=500, text="<html>Internal Server Error</html>")
                if self.mode == "garbage":
                    return web.Response(body=b"\x00\xff not json", content_type="application/json")
                await asyncio.sleep(30)
        return await self.forward_response(request, body)


@pytest.mark.parametrize("mode,error", [("500", "service_unavailable"), ("garbage", "bad_response"),
                                        ("hang", "timeout")])
async def test_client_retries_transport_faults_then_gives_a_typed_error(mode, error):
    service = EnvService()
    async with serve(service) as url:
        async with FaultProxy(url, "/step", mode, times=2) as proxy_url:
            client = EnvClient(proxy_url, request_timeout_s=1.0, max_retries=2, retry_backoff_s=0.01)
            await client.start("_t_env", _row(f"retry-{mode}"), session_id=f"retry-{mode}", max_turns=3)
            step = await client.step(f"retry-{mode}", 1, _msg("x"))  # two faults, the third attempt passes
            assert step["turn_reward"] == 0.5 and client.counts["retries"] == 2
            assert service.counts["steps"] == 1  # the faults never reached the service: obs ran once
            await client.close()
        async with FaultProxy(url, "/step", mode, times=float("inf")) as proxy_url:
            client = EnvClient(proxy_url, request_timeout_s=1.0, max_retries=1, retry_backoff_s=0.01)
            with pytest.raises(EnvServiceError) as e:
                await client.step(f"retry-{mode}", 2, _msg("y"))
            assert e.value.type == error and "after 2 attempts)" in e.value.message
            assert e.value.message.startswith(f"environment service {proxy_url}/step: ")
            await client.close()


def test_the_cli_serves_registered_and_module_tasks_and_stops_cleanly(tmp_path):
    cfg = tmp_path / "tasks.yaml"
    cfg.write_text("gsm8k:\n  feedback: none\n")
    with ServiceProcess("verl_agentic.envserver", "--task-config", str(cfg), "--task-module", "test_envserver",
                        ready="environment service listening on ") as server:
        url = server.url
        assert url.startswith("http://127.0.0.1:")

        async def talk():
            client = EnvClient(url)
            health = await client.health()
            start = await client.start("gsm8k", _gsm8k_row(), session_id="cli", max_turns=3)
            step = await client.step("cli", 1, _msg("#### 5"))  # feedback: none (from --task-config): done
            await client.end("cli")
            await client.start("_t_env", _row("cli-live"), session_id="cli-live")  # left open for shutdown
            await client.close()
            return health, start, step

        health, start, step = asyncio.run(talk())
        assert {"gsm8k", "_t_env", "gen_chat", "dr"} <= set(health["tasks"])
        assert start["session_id"] == "cli" and step["done"] is True
        assert server.stop() == 0
        assert "environment service stopped (2 sessions ended)" in server.stderr_text()
    bad = subprocess.run([sys.executable, "-m", "verl_agentic.envserver", "--task-module", "no_such_module_x"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "--task-module 'no_such_module_x' cannot be imported" in bad.stderr
