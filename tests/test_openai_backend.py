"""OpenAIBackend over real loopback HTTP, against ``FakeOpenAIServer`` (an aiohttp server written here).

The fake speaks the parts of vLLM's OpenAI API the backend uses (``/v1/models``,
``/v1/completions`` with token-id prompts, ``/v1/chat/completions``) and answers a fixed reply.
Each request first takes the next entry of ``faults``: ``500``, ``429``, ``400``, ``drop`` (close
the connection without answering), ``hang`` (never answer), ``garbage`` (not JSON), ``text_tokens``
(logprob tokens as text, not ``token_id:N``), ``mismatch`` (``token_ids`` disagreeing with the
logprob tokens). With no fault left it answers normally. The tests against a real vLLM server are in
``test_vllm.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Optional

import pytest
from aiohttp import web

from verl_agentic.backends.openai_http import (
    OpenAIBackend,
    OpenAIConfig,
    OpenAIServerError,
    ServerResponseError,
    ServerUnavailableError,
)
from verl_agentic.interfaces import ConfigError, EpisodeFailure, SamplingParams
from va_vllm import free_port

IM_END = 151645  # the tiny Qwen model's EOS
REPLY = "The answer is 42.\n#### 42"
GREEDY = SamplingParams(max_new_tokens=64, temperature=0.0)
FAST = dict(max_retries=3, retry_backoff_s=0.01)


class FakeOpenAIServer:
    """A loopback aiohttp server speaking vLLM's OpenAI API; see the module docstring."""

    def __init__(self, reply_ids: list[int], *, send_token_ids: bool = True,
                 tool_calls: Optional[list] = None, port: int = 0):
        self.reply_ids = reply_ids
        self.send_token_ids = send_token_ids
        self.tool_calls = tool_calls
        self.port = port
        self.faults: list[str] = []
        self.bodies: list[dict] = []  # every generation request's JSON body
        self.authorizations: list[Optional[str]] = []  # and its Authorization header
        self.paths: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self.disconnects = 0  # handlers cancelled because the client went away
        self.runner: Optional[web.AppRunner] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeOpenAIServer:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _fault(self, request: web.Request) -> tuple[Optional[web.StreamResponse], Optional[str]]:
        """Play the next fault, if any: a response to send instead of the answer (or None), and the
        fault that changes the answer itself (``text_tokens``, ``mismatch``)."""
        fault = self.faults.pop(0) if self.faults else None
        if fault in ("500", "429", "400"):
            return web.json_response({"error": {"message": f"fake {fault}", "type": "Fake", "code": int(fault)}},
                                     status=int(fault)), None
        if fault == "drop":
            request.transport.close()
            return web.Response(), None
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "garbage":
            return web.Response(text="<html>proxy error</html>", content_type="text/html"), None
        return None, fault

    async def _answer(self, request: web.Request, make) -> web.StreamResponse:
        self.paths.append(request.path)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.bodies.append(body)
            self.authorizations.append(request.headers.get("Authorization"))
            await asyncio.sleep(0.02)  # long enough for concurrent requests to overlap
            instead, fault = await self._fault(request)
            return instead if instead is not None else web.json_response(make(body, fault))
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
        finally:
            self.in_flight -= 1

    def _reply(self, body: dict) -> tuple[list[int], str]:
        ids = self.reply_ids[: body["max_tokens"]]
        return ids, "stop" if ids and ids[-1] in (body.get("stop_token_ids") or [IM_END]) else "length"

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        def make(body: dict, fault: Optional[str]) -> dict:
            ids, finish = self._reply(body)
            tokens = [f"token_id:{t}" for t in ids]
            if fault == "text_tokens":
                tokens = [f"tok{t}" for t in ids]
            choice = {"index": 0, "text": "(server text, unused)", "finish_reason": finish,
                      "logprobs": {"tokens": tokens, "token_logprobs": [-0.1 * (i + 1) for i in range(len(ids))]}}
            if self.send_token_ids:
                choice["token_ids"] = ids if fault != "mismatch" else ids[::-1]
            return {"object": "text_completion", "model": body["model"], "choices": [choice],
                    "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}}

        return await self._answer(request, make)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        def make(body: dict, fault: Optional[str]) -> dict:
            ids, finish = self._reply(body)
            message = {"role": "assistant", "content": "(chat reply)"}
            if self.tool_calls and body.get("tools"):
                message = {"role": "assistant", "content": None, "tool_calls": self.tool_calls}
                finish = "tool_calls"
            content = [{"token": f"token_id:{t}", "logprob": -0.5, "top_logprobs": []} for t in ids]
            return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                                              "logprobs": {"content": content}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": len(ids)}}

        return await self._answer(request, make)


@contextlib.contextmanager
def fake_server_in_thread(reply_ids: list[int]) -> Iterator[FakeOpenAIServer]:
    """A FakeOpenAIServer on its own event loop in a thread, for sync callers (asyncio.run, main_rollout.run)."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(FakeOpenAIServer(reply_ids).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen_dir)


@pytest.fixture(scope="module")
def reply_ids(tokenizer) -> list[int]:
    return tokenizer(REPLY, add_special_tokens=False)["input_ids"] + [IM_END]


@pytest.fixture
async def server(reply_ids):
    s = await FakeOpenAIServer(reply_ids).start()
    yield s
    await s.stop()


@pytest.fixture
def make(tokenizer):
    """``OpenAIBackend(url, tokenizer, ...)`` around the shared tokenizer (loading one takes seconds here)."""
    def make_backend(url: str, **kwargs) -> OpenAIBackend:
        return OpenAIBackend(url, tokenizer, **kwargs)

    return make_backend


@pytest.fixture
async def backend(server, make):
    b = make(server.url + "/v1", **FAST)
    yield b
    await b.close()


# -- the request and the answer -------------------------------------------------------------------
async def test_generate_sends_token_ids_and_returns_them_exactly(backend, server, reply_ids, tokenizer):
    out = await backend.generate([1, 2, 3], SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9,
                                                           seed=11, stop_token_ids=[999]))
    assert out.token_ids == reply_ids and out.finish_reason == "stop" and out.token_ids[-1] == IM_END
    assert out.logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(reply_ids))])
    assert out.text == tokenizer.decode(reply_ids, skip_special_tokens=False)  # our decode, not the server's text
    body = server.bodies[-1]
    assert body["prompt"] == [1, 2, 3] and body["model"] == "fake-model"  # named by GET /v1/models
    assert body["stop_token_ids"] == [IM_END, 999] and body["seed"] == 11 and body["logprobs"] == 0
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["top_k"] == -1
    assert body["return_tokens_as_token_ids"] is True and body["max_tokens"] == 64
    # every sampling knob explicit, so the server's generation_config defaults never apply
    assert body["repetition_penalty"] == 1.0 and body["min_p"] == 0.0 and body["add_special_tokens"] is False
    await backend.generate([4], GREEDY)
    assert server.paths.count("/v1/models") == 1 and "seed" not in server.bodies[-1]
    s = backend.stats()
    assert s["requests"] == 2 and s["generated_tokens"] == 2 * len(reply_ids) and s["prompt_tokens"] == 4
    assert s["attempts"] == 3 and s["retries"] == 0 and s["busy_s"] > 0  # 3: /v1/models too


async def test_length_finish_and_ids_from_token_id_strings(reply_ids, make):
    server = await FakeOpenAIServer(reply_ids, send_token_ids=False).start()  # ids only as "token_id:N"
    b = make(server.url, model="named", **FAST)
    try:
        out = await b.generate([5, 6], SamplingParams(max_new_tokens=3, temperature=0))
        assert out.token_ids == reply_ids[:3] and out.finish_reason == "length" and len(out.logprobs) == 3
        assert server.bodies[-1]["model"] == "named" and "/v1/models" not in server.paths
        assert (await b.generate([5], SamplingParams(max_new_tokens=0))).token_ids == []  # no request
        assert len(server.bodies) == 1
    finally:
        await b.close()
        await server.stop()


@pytest.mark.parametrize("fault,message", [
    ("text_tokens", "is not of the form 'token_id:N'"),
    ("mismatch", "'token_ids' and the logprob tokens disagree"),
    ("garbage", "the answer is not JSON"),
    ("400", "the server refused the request (HTTP 400): fake 400"),
])
async def test_unusable_answers_fail_typed_without_retry(backend, server, fault, message):
    server.faults = [fault]
    with pytest.raises(ServerResponseError) as e:
        await backend.generate([1], GREEDY)
    assert message in str(e.value) and e.value.type == "generation_error"
    assert isinstance(e.value, EpisodeFailure)
    assert backend.stats()["retries"] == 0


# -- retries, timeouts, a server that stays down --------------------------------------------------
@pytest.mark.parametrize("faults", [["500", "500"], ["429"], ["drop", "500", "drop"]])
async def test_transient_failures_are_retried(backend, server, reply_ids, faults):
    server.faults = list(faults)
    out = await backend.generate([1], GREEDY)
    assert out.token_ids == reply_ids
    s = backend.stats()
    assert s["retries"] == len(faults) and s["failed_requests"] == 0 and s["requests"] == 1


async def test_hung_request_times_out_and_is_retried(server, make, reply_ids):
    server.faults = ["hang"]
    b = make(server.url, model="m", request_timeout_s=0.5, **FAST)
    try:
        t0 = time.perf_counter()
        assert (await b.generate([1], GREEDY)).token_ids == reply_ids
        assert 0.5 <= time.perf_counter() - t0 < 5 and b.stats()["retries"] == 1
        server.faults = ["hang"] * 10
        with pytest.raises(ServerUnavailableError, match=r"no answer within 0.5 s .*gave up after 4 attempts"):
            await b.generate([1], GREEDY)
    finally:
        await b.close()


async def test_server_down_gives_typed_error_then_fails_fast_until_it_is_back(make, reply_ids):
    port = free_port()  # nothing listens here yet
    b = make(f"http://127.0.0.1:{port}", model="m", max_retries=3, retry_backoff_s=0.05)
    try:
        with pytest.raises(ServerUnavailableError, match=r"cannot reach the server.*gave up after 4 attempts") as e:
            await b.generate([1], GREEDY)
        assert e.value.type == "generation_error" and isinstance(e.value, OpenAIServerError)
        assert b.stats()["attempts"] == 4 and b.stats()["failed_requests"] == 1
        # the server counts as down: the next request makes one attempt, no backoff
        t0 = time.perf_counter()
        with pytest.raises(ServerUnavailableError, match="gave up after 1 attempt "):
            await b.generate([1], GREEDY)
        assert time.perf_counter() - t0 < 1.0 and b.stats()["attempts"] == 5
        server = await FakeOpenAIServer(reply_ids, port=port).start()  # it comes back on the same port
        try:
            assert (await b.generate([1], GREEDY)).token_ids == reply_ids
            server.faults = ["500"]  # up again: retries are back
            assert (await b.generate([1], GREEDY)).token_ids == reply_ids
            assert b.stats()["retries"] == 3 + 1
        finally:
            await server.stop()
    finally:
        await b.close()


# -- concurrency, cancellation, event loops, closing ---------------------------------------------
async def test_concurrency_limits_requests_in_flight(server, make):
    b = make(server.url, model="m", concurrency=3)
    try:
        outs = await asyncio.gather(*(b.generate([i + 1], GREEDY) for i in range(12)))
        assert len(outs) == 12 and server.max_in_flight == 3
    finally:
        await b.close()


async def test_cancelling_a_call_closes_its_request(backend, server):
    server.faults = ["hang"]
    task = asyncio.create_task(backend.generate([1], GREEDY))
    while server.in_flight == 0:  # the request reached the server (after GET /v1/models)
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if server.disconnects:
            break
        await asyncio.sleep(0.01)
    assert server.disconnects == 1 and server.in_flight == 0


async def test_close_fails_calls_in_flight_and_later_calls(server, make):
    b = make(server.url, model="m")
    server.faults = ["hang"]
    task = asyncio.create_task(b.generate([1], GREEDY))
    while server.in_flight == 0:
        await asyncio.sleep(0.01)
    await b.close()
    with pytest.raises(RuntimeError, match="closed while the request ran"):
        await task
    with pytest.raises(RuntimeError, match="OpenAIBackend is closed"):
        await b.generate([1], GREEDY)
    await b.close()  # idempotent


def test_one_backend_serves_successive_event_loops(reply_ids, make):
    """main_rollout rolls out in one asyncio.run and closes the backend in another."""
    with fake_server_in_thread(reply_ids) as server:
        b = make(server.url, model="m")
        assert asyncio.run(b.generate([1], GREEDY)).token_ids == reply_ids
        assert asyncio.run(b.generate([2], GREEDY)).token_ids == reply_ids
        asyncio.run(b.close())


# -- chat ------------------------------------------------------------------------------------------
async def test_chat_parses_tool_calls_and_tokens(reply_ids, make):
    calculator = {"name": "calculator", "arguments": '{"expression": "2+2"}'}
    calls = [{"id": "call_a", "type": "function", "function": calculator},
             {"type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}]  # no id, a dict
    server = await FakeOpenAIServer(reply_ids, tool_calls=calls).start()
    b = make(server.url, model="m", tool_choice="required", chat_template_kwargs={"enable_thinking": False})
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    try:
        out = await b.chat([{"role": "user", "content": "2+2?"}], SamplingParams(max_new_tokens=8, temperature=0),
                           tools)
        assert out.finish_reason == "tool_calls" and out.message["content"] == ""
        assert out.message["tool_calls"] == [
            {"id": "call_a", "type": "function", "function": calculator},
            {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}]
        assert out.token_ids == reply_ids[:8] and out.logprobs == [-0.5] * 8 and out.prompt_token_count == 7
        body = server.bodies[-1]
        assert body["tools"] == tools and body["tool_choice"] == "required" and body["logprobs"] is True
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["messages"][0]["content"] == "2+2?"
        out = await b.chat([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=64, temperature=0))
        assert out.message == {"role": "assistant", "content": "(chat reply)"} and out.finish_reason == "stop"
        assert "tools" not in server.bodies[-1]
    finally:
        await b.close()
        await server.stop()


async def test_chat_only_api_refuses_generate_with_the_fix(server, make):
    b = make(server.url, model="m", api="chat")
    try:
        with pytest.raises(RuntimeError, match="only speaks /v1/chat/completions.*chat loop"):
            await b.generate([1], GREEDY)
        assert (await b.chat([{"role": "user", "content": "hi"}], GREEDY)).message["content"] == "(chat reply)"
    finally:
        await b.close()


@pytest.mark.parametrize("kwargs,message", [
    (dict(base_url="localhost:8000"), "rollout.openai.base_url must look like http://host:port"),
    (dict(api="responses"), "rollout.openai.api must be one of completions, chat"),
    (dict(concurrency=0), "rollout.openai.concurrency must be an integer >= 1"),
    (dict(max_retries=-1), "rollout.openai.max_retries must be an integer >= 0"),
    (dict(request_timeout_s=0), "rollout.openai.request_timeout_s must be > 0"),
    (dict(tool_choice="any"), "rollout.openai.tool_choice must be one of auto, required, none"),
])
def test_bad_settings_name_the_key(kwargs, message, tokenizer):
    kwargs = {"base_url": "http://127.0.0.1:1", **kwargs}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        OpenAIBackend(kwargs.pop("base_url"), tokenizer, **kwargs)


def test_the_openai_section_is_checked_once_into_a_dataclass():
    from omegaconf import OmegaConf

    from verl_agentic.config import load_config

    section = OmegaConf.to_container(load_config([]).rollout.openai, resolve=True)
    assert OpenAIConfig.from_dict(section) == OpenAIConfig()  # rollout.yaml's defaults are the dataclass's
    with pytest.raises(ConfigError, match=r"unknown rollout.openai keys \['bogus'\]; known: \['base_url', "):
        OpenAIConfig.from_dict({**section, "bogus": 1})
    with pytest.raises(ConfigError, match="rollout.openai.max_retries must be an integer >= 0, got True"):
        OpenAIConfig(max_retries=True)
    assert OpenAIConfig(base_url="http://h:8000/v1/").root_url == "http://h:8000"
    with pytest.raises(dataclasses.FrozenInstanceError):
        OpenAIConfig().api = "chat"


def test_main_rollout_config_builds_the_backend_with_the_api_key_from_the_environment(tiny_qwen_dir, reply_ids,
                                                                                      monkeypatch):
    from verl_agentic.main_rollout import load_config, make_backend

    keys = [f"model.path={tiny_qwen_dir}", "rollout.backend=openai", "rollout.openai.api_key_env=VA_TEST_KEY",
            "rollout.openai.model=served", "rollout.openai.concurrency=5", "rollout.openai.tool_choice=none"]
    monkeypatch.delenv("VA_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="rollout.openai.api_key_env=VA_TEST_KEY, but that environment variable"):
        make_backend(load_config(keys))
    monkeypatch.setenv("VA_TEST_KEY", "sk-test")
    with fake_server_in_thread(reply_ids) as server:
        b = make_backend(load_config([*keys, f"rollout.openai.base_url={server.url}/v1"]))
        assert (b.model, b.concurrency, b.tool_choice, b.stop_token_ids) == ("served", 5, "none", [IM_END])
        assert asyncio.run(b.generate([1], GREEDY)).token_ids == reply_ids
        asyncio.run(b.close())
        assert server.authorizations == ["Bearer sk-test"] and server.bodies[0]["model"] == "served"


def test_stop_ids_come_from_the_model_folder_else_the_tokenizer(tiny_qwen_dir, smol_dir):
    from va_testing import QWEN25_DIR

    assert OpenAIBackend.from_pretrained(tiny_qwen_dir, "http://h:1").stop_token_ids == [IM_END]
    assert OpenAIBackend.from_pretrained(smol_dir, "http://h:1").stop_token_ids == [2]  # <|im_end|>, not the GGUF EOS
    assert OpenAIBackend.from_pretrained(QWEN25_DIR, "http://h:1").stop_token_ids == [IM_END]  # tokenizer only
    with pytest.raises(FileNotFoundError, match="no tokenizer folder at '/no/such'"):
        OpenAIBackend.from_pretrained("/no/such", "http://h:1")


# -- through the rollout ---------------------------------------------------------------------------
def test_rollout_through_the_fake_server_is_token_exact_and_a_dead_one_is_typed(reply_ids, tiny_qwen_dir,
                                                                                tmp_path):
    """main_rollout with rollout.backend=openai: multi-turn GSM8K trajectories pass the drift check;
    with the server gone, every episode carries a generation_error naming ServerUnavailableError."""
    from verl_agentic.main_rollout import load_config, run

    common = [f"model.path={tiny_qwen_dir}", "rollout.backend=openai", "data.max_samples=3", "rollout.n=2",
              "rollout.max_turns=3", "task.gsm8k.feedback=always_verify", "output.quiet=true",
              "rollout.openai.max_retries=1", "rollout.openai.retry_backoff_s=0.01", "reward.manager=none"]
    with fake_server_in_thread(reply_ids) as server:
        trajs, summary = run(load_config([*common, f"rollout.openai.base_url={server.url}",
                                          f"output.dir={tmp_path / 'up'}"]))
        assert len(trajs) == 6 and all(t["error"] is None and t["num_turns"] == 3 for t in trajs)
        assert summary["drift"]["episodes_ok"] == 6 and summary["drift"]["injected_differing_tokens"] == 0
        for t in trajs:  # the generated turns are the server's ids, mask 1, with its logprobs
            first = t["turns"][0]
            assert t["response_ids"][first["start"]:first["end"]] == reply_ids
            assert t["response_logprobs"][first["start"]] == pytest.approx(-0.1)
        assert summary["backend"]["requests"] == 18 and summary["stop_token_ids"] == [IM_END]
    trajs, _ = run(load_config([*common, f"rollout.openai.base_url={server.url}", f"output.dir={tmp_path / 'down'}"]))
    assert len(trajs) == 6 and len((tmp_path / "down" / "trajectories.jsonl").read_text().splitlines()) == 6
    for t in trajs:
        assert t["finish_reason"] == "error" and t["error"]["type"] == "generation_error"
        assert "ServerUnavailableError" in t["error"]["message"] and "cannot reach the server" in t["error"]["message"]
