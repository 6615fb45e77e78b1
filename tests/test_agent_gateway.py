"""Bring your own agent (verl_agentic/tasks/agent.py, serving/gateway.py): unchanged programs that call an
OpenAI-style endpoint, through the real ``openai`` client, captured as token-exact training rows.

The model is a TEST DOUBLE where a test needs tool calls (``ScriptedCalculatorPolicy``: it writes a hermes
calculator call, then the answer, tokenized by the real Qwen2.5 tokenizer; SmolLM2 calls no tool from a
prompt); the last test runs the embedded SmolLM2 in ``main_rollout``. The gateway, the HTTP, the OpenAI
SDK, the chat template, the parser, the rollout loop and the drift check are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import openai
import pytest
import torch

from verl_agentic.interfaces import ConfigError, GenOutput
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift
from verl_agentic.rollout.trajectory import training_rows
from verl_agentic.serving.gateway import Gateway
from verl_agentic.tasks import register_task
from verl_agentic.tasks.agent import agent_task
from verl_agentic.tools.calculator import evaluate_expression, format_number

from va_agents import CALCULATOR, PROBLEMS, ScriptedCalculatorPolicy

SEEN: dict[str, list] = {}


async def calculator_agent(row, client):
    """An ordinary tool-calling agent loop, written against the OpenAI SDK and nothing else."""
    messages = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": row["question"]}]
    replies = []
    while True:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR],
                                                     max_tokens=64, temperature=0.3, logprobs=True)
        replies.append(reply)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            value = format_number(evaluate_expression(json.loads(call.function.arguments)["expression"]))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": value})
    SEEN[row["question"]] = replies
    answer = message.content.split("####")[-1].strip()
    return {"reward": float(answer == row["answer"]), "metrics": {"tool_calls": len(replies) - 1},
            "call_rewards": [0.5] * len(replies)}


def sync_agent(row, client):
    """The same, synchronous (the SDK's blocking client, run in a thread)."""
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["question"]}],
                                           tools=[CALCULATOR])
    call = reply.choices[0].message.tool_calls[0]
    return 1.0 if json.loads(call.function.arguments)["expression"] == PROBLEMS[row["question"]][0] else 0.0


async def rewriting_agent(row, client):
    """Sends a second request whose history is not the one answered (a summarised context)."""
    first = await client.chat.completions.create(model="policy", tools=[CALCULATOR],
                                                 messages=[{"role": "user", "content": row["question"]}])
    try:
        await client.chat.completions.create(model="policy", tools=[CALCULATOR], messages=[
            {"role": "user", "content": "Summary: " + row["question"]},
            first.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "0"}])
    except openai.BadRequestError as e:
        return {"reward": 0.25, "metrics": {"refused": 1.0, "history_changed": float(e.type == "history_changed"),
                                            "says_why": float("split_rows=false" in e.body["message"])}}
    return {"reward": 1.0, "metrics": {"refused": 0.0}, "call_rewards": [0.1, 0.9]}


async def chatty_agent(row, client):
    """Keeps calling after the episode's turns run out."""
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(5):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "1"}]
    return 1.0


async def crashing_agent(row, client):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["question"]}])
    raise RuntimeError("the agent's own bug")


async def silent_agent(row, client):
    return 1.0


STARTED_HANGING: list[str] = []
REFUSED: dict[str, dict] = {}


async def asking_too_much_agent(row, client):
    """Asks for two choices, another model, more tokens than the context and -3 tokens, then makes a good call."""
    messages = [{"role": "user", "content": row["question"]}]
    refused = {}
    for name, ask in (("n", {"n": 2}), ("model", {"model": "gpt-4o"}), ("tokens", {"max_tokens": 10**6}),
                      ("negative", {"max_tokens": -3})):
        try:
            await client.chat.completions.create(**{"model": "policy", "messages": messages, **ask})
        except openai.APIStatusError as e:  # what an agent written with the SDK catches
            refused[name] = (type(e).__name__, e.status_code, e.body["type"], e.body["message"])
    REFUSED[row["question"]] = refused
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    return 1.0


async def hanging_agent(row, client):
    """Never calls the model and never returns (a stuck agent, before its first request)."""
    STARTED_HANGING.append(row["question"])
    await asyncio.sleep(3600)


async def impatient_agent(row, client):
    """Its client gives up after 0.2 s; the (slow) policy takes longer."""
    await client.with_options(timeout=0.2).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["question"]}])
    return 1.0


class SlowPolicy(ScriptedCalculatorPolicy):
    """TEST DOUBLE: the scripted policy, 1 s a reply."""

    async def generate(self, prompt_ids, sampling):
        await asyncio.sleep(1.0)
        return await super().generate(prompt_ids, sampling)


class BrokenCallPolicy(ScriptedCalculatorPolicy):
    """TEST DOUBLE: writes a tool call whose JSON is cut off."""

    async def generate(self, prompt_ids, sampling):
        ids = self.tokenizer.encode('<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>',
                                    add_special_tokens=False) + [self.end_id]
        return GenOutput(ids, [0.0] * len(ids), self.tokenizer.decode(ids), "stop")


async def one_call_agent(row, client):
    reply = await client.chat.completions.create(model="policy", tools=[CALCULATOR],
                                                 messages=[{"role": "user", "content": row["question"]}])
    choice = reply.choices[0]
    return {"reward": 0.0, "metrics": {"plain": float(choice.finish_reason == "stop" and not choice.message.tool_calls
                                                      and "<tool_call>" in choice.message.content)}}


for _name, _agent in [("va_calc_agent", calculator_agent), ("va_sync_agent", sync_agent),
                      ("va_rewriting_agent", rewriting_agent), ("va_chatty_agent", chatty_agent),
                      ("va_crashing_agent", crashing_agent), ("va_silent_agent", silent_agent),
                      ("va_hanging_agent", hanging_agent), ("va_asking_too_much_agent", asking_too_much_agent),
                      ("va_impatient_agent", impatient_agent), ("va_one_call_agent", one_call_agent)]:
    register_task(_name, agent_task(_agent))


def _rows(task_type: str) -> list[dict]:
    return [{"task_type": task_type, "question": q, "answer": a, "index": i} for i, (q, (_, a)) in enumerate(PROBLEMS.items())]


async def _rollout(policy, task_type: str, max_turns: int = 4, task_config: dict | None = None, **limits) -> list[dict]:
    cfg = RolloutConfig(max_turns=max_turns, max_new_tokens=128, max_total_tokens=2048, temperature=1.0, concurrency=4,
                        **limits)
    return await AsyncRollout(policy, cfg, seed=0, task_configs={task_type: task_config or {}}).run(_rows(task_type))


async def test_an_openai_sdk_agent_with_tool_calls_becomes_one_token_exact_row_per_episode(qwen25_tokenizer):
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    trajs = await _rollout(policy, "va_calc_agent")
    assert [t["reward"] for t in trajs] == [1.0, 1.0] and all(t["error"] is None for t in trajs)
    for traj in trajs:
        # the agent got OpenAI-shaped answers: a parsed tool call, then the text; logprobs per token
        first, last = SEEN[traj["messages"][1]["content"]]
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "calculator"
        assert json.loads(call.function.arguments)["expression"] in ("12*7", "45-17")
        assert last.choices[0].finish_reason == "stop" and "####" in last.choices[0].message.content
        assert [c.logprob for c in first.choices[0].logprobs.content] == [-0.25] * first.usage.completion_tokens
        # one row: the generated ids as generated (mask 1, their logprobs), the tool reply injected (mask 0)
        assistant = [t for t in traj["turns"] if t["role"] == "assistant"]
        assert len(assistant) == 2 and [t["role"] for t in traj["turns"]] == ["assistant", "tool", "assistant"]
        for turn in assistant:
            ids = traj["response_ids"][turn["start"]:turn["end"]]
            assert ids in policy.replies and set(traj["response_mask"][turn["start"]:turn["end"]]) == {1}
            assert traj["response_logprobs"][turn["start"]:turn["end"]] == [-0.25] * len(ids)
            assert turn["reward"] == 0.5  # call_rewards
        tool = traj["turns"][1]
        assert set(traj["response_mask"][tool["start"]:tool["end"]]) == {0}
        assert traj["metrics"]["agent_calls"] == 2 and traj["metrics"]["tool_calls"] == 1
        # token-exact against the chat template over the conversation the agent sent (tools included)
        report = check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id])
        assert report.ok and report.injected_tokens > 0, report.as_dict()
        assert traj["tools"] == [CALCULATOR]


async def test_a_synchronous_agent_runs_in_a_thread_with_the_blocking_client(qwen25_tokenizer):
    trajs = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_sync_agent")
    assert [t["reward"] for t in trajs] == [1.0, 1.0]
    assert all(t["metrics"]["agent_calls"] == 1 and len(t["turns"]) == 1 for t in trajs)


async def test_a_changed_history_starts_a_new_row_of_the_episode_each_token_exact(qwen25_tokenizer):
    """A request whose history is not the one answered (a summarised context) starts a second row: its
    whole conversation is the row's prompt; both rows are token-exact, only generated tokens are trained
    on, and the per-call rewards land on the calls across the rows."""
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    trajs = await _rollout(policy, "va_rewriting_agent")
    for traj in trajs:
        assert traj["error"] is None and traj["reward"] == 1.0 and traj["metrics"]["refused"] == 0.0
        assert traj["metrics"]["agent_rows"] == 2 and traj["metrics"]["agent_calls"] == 2
        (before,) = traj["rows_before"]
        assert before["split_reason"] == "history_changed" and [m["role"] for m in before["messages"]] == [
            "user", "assistant"]
        assert traj["messages"][0]["content"].startswith("Summary: ")  # the last row: the new conversation
        assert [m["role"] for m in traj["messages"]] == ["user", "assistant", "tool", "assistant"]
        rows = training_rows(traj)
        assert [(r["row"], r["rows"]) for r in rows] == [(0, 2), (1, 2)] and rows[0]["split_reason"] == "history_changed"
        assert rows[0]["prompt_ids"] != rows[1]["prompt_ids"]
        assert qwen25_tokenizer.decode(rows[1]["prompt_ids"]).count("Summary: ") == 1
        for r in rows:  # mask 1 exactly on what the policy generated, in each row
            generated = [i for i, m in zip(r["response_ids"], r["response_mask"]) if m]
            assert generated in policy.replies and [t["role"] for t in r["turns"]] == ["assistant"]
        assert [t["reward"] for r in rows for t in r["turns"] if t["role"] == "assistant"] == [0.1, 0.9]
        report = check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id])
        assert report.ok and report.generated_tokens == sum(sum(r["response_mask"]) for r in rows), report.as_dict()


async def test_with_split_rows_false_a_changed_history_is_refused_with_the_reason(qwen25_tokenizer):
    trajs = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_rewriting_agent",
                           task_config={"split_rows": False})
    for traj in trajs:
        assert traj["reward"] == 0.25 and traj["metrics"]["history_changed"] == traj["metrics"]["says_why"] == 1.0
        assert traj["metrics"]["agent_rejected_requests"] == 1 and len(traj["turns"]) == 1
        assert traj["error"] is None and traj["finish_reason"] == "stop"


async def test_a_call_past_the_episodes_turns_is_refused_and_the_agents_failure_is_the_episodes(qwen25_tokenizer):
    trajs = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_chatty_agent", max_turns=2)
    for traj in trajs:
        assert traj["finish_reason"] == "error" and traj["reward"] == 0.0
        assert traj["error"]["type"] == "task_error" and "episode ended (max_turns" in traj["error"]["message"]
        assert len([t for t in traj["turns"] if t["role"] == "assistant"]) == 2  # the tokens are kept


async def test_an_agent_that_raises_or_never_calls_the_model_fails_its_episode_typed(qwen25_tokenizer):
    crashed = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_crashing_agent")
    assert all(t["error"]["type"] == "task_error" and "the agent's own bug" in t["error"]["message"]
               and len(t["turns"]) == 1 for t in crashed)
    silent = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_silent_agent")
    assert all("the agent made no model call" in t["error"]["message"] for t in silent)


async def test_an_agent_that_hangs_before_its_first_call_times_out_with_the_episode(qwen25_tokenizer, tmp_path):
    """rollout.episode_timeout_s covers start too: an agent stuck before its first request (a callable, and
    a command that sleeps) ends its episode with a typed timeout, is stopped at once, and its key is closed."""
    STARTED_HANGING.clear()
    t0 = asyncio.get_running_loop().time()
    trajs = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_hanging_agent", episode_timeout_s=1.0)
    assert sorted(STARTED_HANGING) == sorted(PROBLEMS)  # both agents ran
    assert all(t["error"]["type"] == "timeout" and "start did not return within rollout.episode_timeout_s=1.0"
               in t["error"]["message"] and t["turns"] == [] for t in trajs)
    script = tmp_path / "stuck.py"
    script.write_text("import sys, time\nsys.stdin.read()\nopen(sys.argv[1], 'w').write('started')\ntime.sleep(600)\n")
    register_task("va_stuck_command", agent_task(command=[sys.executable, str(script), str(tmp_path / "started")]),
                  replace=True)
    stuck = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_stuck_command", episode_timeout_s=2.0)
    assert (tmp_path / "started").read_text() == "started"
    assert all(t["error"]["type"] == "timeout" for t in stuck)
    # stopped at once, not after finish_timeout_s (30 s) or the agents' own sleeps
    assert asyncio.get_running_loop().time() - t0 < 15
    from verl_agentic.serving.gateway import gateway_for_loop
    assert gateway_for_loop().open_sessions == 0


async def test_requests_past_what_the_gateway_serves_get_errors_the_sdk_understands(qwen25_tokenizer):
    """n > 1, an unknown model and more tokens than the context: an HTTP error the SDK raises as its own
    typed exception, naming the limit; counted, and the episode goes on with the agent's next request."""
    REFUSED.clear()
    trajs = await _rollout(ScriptedCalculatorPolicy(qwen25_tokenizer), "va_asking_too_much_agent")
    for traj in trajs:
        refused = REFUSED[traj["messages"][0]["content"]]
        assert refused["n"][:3] == ("BadRequestError", 400, "unsupported")
        assert refused["model"][:3] == ("NotFoundError", 404, "model_not_found") and "'policy'" in refused["model"][3]
        assert refused["tokens"][:3] == ("BadRequestError", 400, "context_length_exceeded")
        assert "max_tokens=1000000" in refused["tokens"][3] and "2048" in refused["tokens"][3]
        assert refused["negative"][:3] == ("BadRequestError", 400, "bad_request") and "-3" in refused["negative"][3]
        assert traj["error"] is None and traj["reward"] == 1.0
        assert traj["metrics"]["agent_rejected_requests"] == 4 and traj["metrics"]["agent_calls"] == 1
        assert len(traj["response_ids"]) <= 8  # the good call's max_tokens capped the turn


async def test_an_agent_whose_client_gives_up_fails_its_episode_and_a_broken_call_is_answered_as_text(
        qwen25_tokenizer):
    impatient = await _rollout(SlowPolicy(qwen25_tokenizer), "va_impatient_agent")
    assert all(t["error"]["type"] == "task_error" and "Timeout" in t["error"]["message"] for t in impatient)
    broken = await _rollout(BrokenCallPolicy(qwen25_tokenizer), "va_one_call_agent")
    assert all(t["error"] is None and t["metrics"]["plain"] == 1.0 and t["metrics"]["agent_parse_errors"] == 1
               for t in broken)


async def test_the_gateway_streams_when_asked_and_names_the_problem_with_a_wrong_key():
    """A session answering "hi", then a tool call: the SDK reads both plain and streamed (the whole answer
    in one delta, the finish reason, the usage when asked), and the same through the Responses API
    streamed; a wrong key is a 401 that says why."""
    class Echo:
        bodies: list[dict] = []

        async def complete(self, body):
            self.bodies.append(body)
            message = {"role": "assistant", "content": "hi"}
            if body.get("tools"):
                message = {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}]}
            return {"id": "x", "object": "chat.completion", "created": 0, "model": "policy", "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if body.get("tools") else "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}

    gateway = Gateway()
    base_url, key = await gateway.open(Echo())
    try:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
            assert [m.id for m in (await client.models.list()).data] == ["policy"]
            reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
            assert reply.choices[0].message.content == "hi"
            chunks = [c async for c in await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "x"}], stream=True,
                stream_options={"include_usage": True})]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"
            assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
            assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 4
            calls = [c async for c in await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "x"}], tools=[CALCULATOR], stream=True)]
            (call,) = calls[0].choices[0].delta.tool_calls
            assert (call.index, call.id, call.function.name) == (0, "call_1", "calculator")
            assert calls[-1].choices[0].finish_reason == "tool_calls" and len(calls) == 2
            assert all("stream" not in b and "stream_options" not in b for b in Echo.bodies)  # the session's body
            # the Responses API streamed: the SDK's own stream helper rebuilds the response from the events
            async with client.responses.stream(model="policy", input="x") as events:
                kinds = [e.type async for e in events]
                final = await events.get_final_response()
            assert final.output_text == "hi" and final.status == "completed" and final.usage.total_tokens == 4
            assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                             "response.content_part.done", "response.output_item.done", "response.completed"]
            async with client.responses.stream(model="policy", input="x", tools=[
                    {"type": "function", "name": "calculator", "parameters": CALCULATOR["function"]["parameters"]}]) as events:
                kinds = [e.type async for e in events]
                final = await events.get_final_response()
            (call,) = final.output
            assert (call.type, call.call_id, call.name, call.arguments) == (
                "function_call", "call_1", "calculator", '{"expression": "1+1"}')
            assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
            raw = [e async for e in await client.responses.create(model="policy", input="x", stream=True)]
            assert [e.sequence_number for e in raw] == list(range(len(raw))) and raw[-1].response.output_text == "hi"
            assert all("stream" not in b for b in Echo.bodies)
        async with openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError, match="names no running episode"):
                await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    finally:
        await gateway.close(key)
    assert gateway.open_sessions == 0 and gateway._runner is None  # the server stops with its last session


def test_agent_task_refuses_what_it_cannot_run():
    with pytest.raises(ConfigError, match="either an agent callable or command"):
        agent_task()
    with pytest.raises(ConfigError, match="callable as agent"):
        agent_task("not callable")
    spec = agent_task(calculator_agent)
    with pytest.raises(ConfigError, match="parser"):
        spec.check_config({"parser": "nope"})
    with pytest.raises(ConfigError, match="unknown"):
        spec.check_config({"finish_timeout": 3})


AGENT_SCRIPT = textwrap.dedent('''
    import json, sys
    from openai import OpenAI

    row = json.load(sys.stdin)
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    messages = list(row["prompt"])  # the preprocessed row's
    reply = client.chat.completions.create(model="policy", messages=messages)
    # the conversation goes on: the same training row
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Are you sure?"}]
    client.chat.completions.create(model="policy", messages=messages)
    # a fresh, summarised conversation: the episode's second training row
    again = client.chat.completions.create(model="policy", messages=[
        {"role": "user", "content": "Briefly: " + row["prompt"][-1]["content"]}])
    print("some log line")
    print(json.dumps({"reward": float(len(again.choices[0].message.content) > 0), "metrics": {"chars": 1}}))
''')


def test_a_command_agent_and_the_embedded_model_through_main_rollout(tmp_path, smol_dir, smol_tokenizer):
    """``main_rollout`` with our hf engine and the embedded SmolLM2: a command agent (the OpenAI SDK in a
    subprocess, the row on stdin) registered in a user's module: its second call continues the first's
    conversation (the same row), its third starts a fresh one (a second row); every row is token-exact, and the recorded run replays with no model
    (the agent program runs again against the recorded tokens, compared row by row)."""
    import subprocess

    (tmp_path / "agent.py").write_text(AGENT_SCRIPT)
    (tmp_path / "my_agents.py").write_text(textwrap.dedent(f'''
        import sys
        from verl_agentic.tasks import register_task
        from verl_agentic.tasks.agent import agent_task
        register_task("cli_agent", agent_task(command=[sys.executable, {str(tmp_path / "agent.py")!r}]))
    '''))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"task_type": "cli_agent", "question": f"What is {i} + {i}?",
                                        "answer": str(2 * i)}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", "imports=[my_agents]",
                           f"model.path={smol_dir}", f"data.path={data}", f"output.dir={out}", "rollout.max_turns=3",
                           "rollout.max_new_tokens=16", "rollout.temperature=0", "output.record=true"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajs = [json.loads(line) for f in sorted(out.glob("**/*.jsonl")) if "trajector" in f.name
             for line in f.read_text().splitlines()]
    assert len(trajs) == 3, sorted(str(p) for p in out.rglob("*"))
    stop = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for traj in trajs:
        assert traj["error"] is None and traj["reward"] in (0.0, 1.0) and traj["metrics"]["chars"] == 1.0
        assert traj["metrics"]["agent_rows"] == 2 and traj["rows_before"][0]["split_reason"] == "history_changed"
        assert traj["metrics"]["agent_calls"] == 3  # two calls merged in the first row, one in the second
        assert [t["role"] for t in traj["rows_before"][0]["turns"]] == ["assistant", "user", "assistant"]
        assert [t["role"] for t in traj["turns"]] == ["assistant"]
        report = check_drift(traj, smol_tokenizer, stop_token_ids=[stop])
        assert report.ok and report.generated_tokens == sum(sum(r["response_mask"]) for r in training_rows(traj))
    # the recording holds each HTTP request the agent sent (the messages the conversation did not hold yet)
    # and the answer it got
    from verl_agentic.record import read_episodes

    for record, traj in zip(read_episodes(out), sorted(trajs, key=lambda t: (t["index"], t["sample_id"]))):
        calls = [e for e in record["events"] if e["door"] == "agent_http"]
        prompt = len(calls[0]["request"]["messages"])
        assert [(c["turn"], c["request"]["messages_before"], len(c["request"]["messages"])) for c in calls] == [
            (1, 0, prompt), (2, prompt + 1, 1), (3, 0, 1)]
        assert calls[2]["request"]["messages"][0]["content"].startswith("Briefly: ")
        assert all(c["request"]["model"] == "policy" and "tool_call_id" not in json.dumps(c["request"]) for c in calls)
        answers = [c["answer"]["choices"][0]["message"]["content"] for c in calls]
        assert answers == [m["content"] for r in training_rows(traj) for m in r["messages"] if m["role"] == "assistant"]
    # the recording replays with no model: the same agent program, answered from the recorded tokens
    def replay() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "verl_agentic.replay", str(out)], capture_output=True, text=True,
                              timeout=600, cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})

    proc = replay()
    assert proc.returncode == 0 and "3 same as recorded, 0 differ" in proc.stdout, proc.stdout + proc.stderr
    # an agent program whose third request changed in a field that changes no token (the gateway ignores a
    # temperature): only the recorded requests show it, and the replay names that request
    changed = AGENT_SCRIPT.replace('again = client.chat.completions.create(model="policy", ',
                                   'again = client.chat.completions.create(model="policy", temperature=0.3, ')
    assert changed != AGENT_SCRIPT
    (tmp_path / "agent.py").write_text(changed)
    proc = replay()
    assert proc.returncode == 1 and "0 same as recorded, 3 differ" in proc.stdout, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("episode ")]
    assert len(lines) == 3 and all(": turn 3: agent_http differ" in x and "temperature" in x for x in lines), lines


@pytest.mark.parametrize("use_ray", [False, pytest.param(True, marks=pytest.mark.serial)],  # Ray: its own cluster
                         ids=["in_process", "ray"])
def test_main_ppo_trains_a_step_on_an_agent_tasks_rows(tmp_path, tiny_smol_dir, use_ray):
    """Our trainer (``main_ppo``, one GRPO step, a tiny random model) on a callable agent registered in a
    user's module: the step's rows are the agent's episodes, scored by the agent's own reward; every other
    episode changes its history (a second row), so the step trains a batch of 6 rows from 4 episodes. In
    process the step uses turn-level credit across the rows (``turn_loo`` with the agent's ``call_rewards``);
    with ``trainer.use_ray=true`` GRPO, and the episodes run in the rollout actor (its own process and
    event loop)."""
    import subprocess

    (tmp_path / "my_agents.py").write_text(textwrap.dedent('''
        import itertools
        from verl_agentic.tasks import register_task
        from verl_agentic.tasks.agent import agent_task

        EPISODES = itertools.count()

        async def length_agent(row, client):
            reply = await client.chat.completions.create(model="policy", messages=row["prompt"])
            calls = 1
            if next(EPISODES) % 2 == 0:  # a summarised context: the episode's second row
                question = row["prompt"][-1]["content"]
                reply = await client.chat.completions.create(model="policy", messages=[
                    {"role": "user", "content": "In short: " + question}])
                calls = 2
            return {"reward": min(1.0, len(reply.choices[0].message.content) / 20), "metrics": {"answered": 1},
                    "call_rewards": [0.25] * calls}

        register_task("length_agent", agent_task(length_agent))
    '''))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"Say {i}.", "answer": str(i)}) + "\n" for i in range(4)))
    proc = subprocess.run(
        [sys.executable, "-m", "verl_agentic.main_ppo", "imports=[my_agents]", f"model.path={tiny_smol_dir}",
         f"data.path={data}", "data.max_samples=4", "task_type=length_agent", "trainer.total_steps=1", "rollout.max_turns=2",
         "trainer.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8", "actor.ppo_mini_batch_size=4",
         "actor.ppo_micro_batch_size=4", "trainer.val_before_train=false", "trainer.save_hf_model=false",
         "output.dir=out", "output.quiet=true", f"trainer.use_ray={str(use_ray).lower()}",
         *(["trainer.ray_init.num_cpus=2"] if use_ray else
           ["algorithm.adv_estimator=turn_loo", "algorithm.turn_rewards=true"])],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path), "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    trajs = [json.loads(x) for x in (tmp_path / "out" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 and {t["task_type"] for t in trajs} == {"length_agent"}
    for t in trajs:
        assert t["error"] is None and t["metrics"]["answered"] == 1
        assert t["metrics"]["agent_calls"] == t["metrics"]["agent_rows"] == 1 + len(t.get("rows_before") or [])
        assert t["score"] == pytest.approx(t["reward"]) and t["score_extra"] == {"scored_by": "episode_reward"}
    assert sorted(t["metrics"]["agent_rows"] for t in trajs) == [1, 1, 2, 2]
    for t in trajs:  # the call_rewards on the calls, across the rows
        assert [turn.get("reward") for r in [*(t.get("rows_before") or []), t] for turn in r["turns"]
                if turn["role"] == "assistant"] == [0.25] * int(t["metrics"]["agent_calls"])
    (step,) = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
               if json.loads(x).get("step") == 1]
    assert (step["batch/rows"], step["batch/episodes"]) == (6, 4) and step["actor/pg_loss"] == step["actor/pg_loss"]


def test_grpo_groups_count_episodes_not_rows_and_every_row_gets_its_episodes_advantage():
    """main_ppo's advantages for a batch with an episode of several rows (verl's own GRPO, a real batch):
    one prompt, three episodes with rewards 1, 0, 0, the first of them in three rows (its reward on the
    last). GRPO over the episodes gives +1.155 / -0.577 / -0.577 (mean 1/3, std 0.577); every row of the
    first episode gets +1.155 on its own generated tokens. Counting rows instead would give other numbers
    (checked)."""
    from verl.trainer.config import AlgoConfig

    from verl_agentic.trainer.batch import build_batch, to_dataproto
    from verl_agentic.trainer.ppo import episode_advantages
    from verl_agentic.trainer.verl_config import verl_modules

    _, ray_trainer, _ = verl_modules()

    def row(n: int, injected: int = 0) -> dict:
        return {"prompt_ids": [1, 2, 3], "response_ids": [5] * n + [6] * injected,
                "response_mask": [1] * n + [0] * injected, "response_logprobs": [-0.1] * n + [None] * injected}

    rows = [row(2, injected=2), row(3), row(1), row(2), row(4)]
    episode_of = [0, 0, 0, 1, 2]

    def data(scores):
        d = to_dataproto(build_batch(rows, scores, pad_id=0, uids=["prompt-0"] * 5))
        d.batch["token_level_rewards"] = d.batch["token_level_scores"]
        return d

    def estimate(d):
        return ray_trainer.compute_advantage(d, adv_estimator="grpo", num_repeat=3, norm_adv_by_std_in_grpo=True,
                                             config=AlgoConfig(adv_estimator="grpo"))

    out = episode_advantages(data([0.0, 0.0, 1.0, 0.0, 0.0]), episode_of, estimate)
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    expected = [2 / 3 / (1 / 3) ** 0.5, -1 / 3 / (1 / 3) ** 0.5, -1 / 3 / (1 / 3) ** 0.5]  # std over 3: unbiased
    for i, e in enumerate(episode_of):
        generated = mask[i] > 0
        assert adv[i][generated].tolist() == pytest.approx([expected[e]] * int(generated.sum()), abs=1e-4)
        assert adv[i][~generated].abs().sum() == 0  # injected tokens and padding get none
    assert torch.equal(out.batch["returns"], adv)
    counted_rows = estimate(data([1.0, 1.0, 1.0, 0.0, 0.0])).batch["advantages"]  # one row per sample
    assert counted_rows[0][0] == pytest.approx(0.730, abs=1e-3) and counted_rows[0][0] != pytest.approx(expected[0], abs=0.1)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "turn_loo", "gae"])
def test_an_episode_of_two_rows_gets_the_advantages_of_its_turns_in_one_row(estimator):
    """Turn-level credit across rows: main_ppo's batch of an episode split in two rows (turn 1 in the first
    row; turns 2 and 3 in the second, after a changed history), with per-turn rewards
    (``algorithm.turn_rewards``: 0.3 on turn 1, 0.2 on turn 2, the outcome 1.0 on turn 3), beside two
    episodes of one row, gets from each verl estimator exactly the advantages and returns the same three
    turns get when they stand in one row (a masked position between them). With ``turn_loo`` the turns of
    the split episode get different advantages: the rows do not share one number."""
    from types import SimpleNamespace

    from verl.trainer.config import AlgoConfig

    from verl_agentic.trainer import ppo
    from verl_agentic.trainer.batch import build_batch, to_dataproto
    from verl_agentic.trainer.verl_config import verl_modules

    _, ray_trainer, _ = verl_modules()

    def turns(*spans_rewards):
        return [{"role": "assistant", "start": a, "end": b, "reward": r} for a, b, r in spans_rewards]

    def episode(ids, mask, spans, group="1-0", rows_before=()):
        return {"prompt_ids": [1, 2], "response_ids": ids, "response_mask": mask,
                "response_logprobs": [-0.2 if m else None for m in mask], "messages": [], "turns": spans,
                "group": group, "rows_before": list(rows_before)}

    first_row = {**episode([5, 6], [1, 1], turns((0, 2, 0.3))), "split_reason": "history_changed"}
    split = episode([7, 8, 9, 3, 3, 4], [1, 1, 1, 0, 0, 1], turns((0, 3, 0.2), (5, 6, None)), rows_before=[first_row])
    one_row = episode([5, 6, 0, 7, 8, 9, 3, 3, 4], [1, 1, 0, 1, 1, 1, 0, 0, 1],
                      turns((0, 2, 0.3), (3, 6, 0.2), (8, 9, None)))
    others = [episode([5, 4, 3, 3, 4], [1, 1, 0, 0, 1], turns((0, 2, 0.5), (4, 5, None))),
              episode([6, 6, 6], [1, 1, 1], turns((0, 3, None)))]
    rewards = [1.0, 0.0, 0.5]
    trainer = SimpleNamespace(conf=SimpleNamespace(algorithm=SimpleNamespace(turn_rewards=True)), pad_id=0, step=0)
    config = AlgoConfig(adv_estimator=estimator, gamma=1.0, lam=0.9)

    def estimate(d):
        return ray_trainer.compute_advantage(d, adv_estimator=estimator, gamma=1.0, lam=0.9, num_repeat=3,
                                             norm_adv_by_std_in_grpo=True, config=config)

    def with_values(d, values_of):
        d.batch["token_level_rewards"] = d.batch["token_level_scores"]
        if estimator == "gae":  # a critic's values, the same for the same token wherever it stands
            ids, mask = d.batch["responses"], d.batch["response_mask"]
            d.batch["values"] = values_of(ids) * mask
        return d

    def values_of(ids):
        return (ids.float() * 0.37).sin()

    batch, rows, episode_of = ppo.PPOTrainer._batch(trainer, [split, *others], rewards)
    assert episode_of == [0, 0, 1, 2] and batch.scores.tolist() == pytest.approx([0.3, 1.0, 0.0, 0.5])
    got = ppo.episode_advantages(with_values(to_dataproto(batch), values_of), episode_of, estimate)
    reference = build_batch([one_row, *others], rewards, pad_id=0, uids=["1-0"] * 3, turn_rewards=True)
    want = estimate(with_values(to_dataproto(reference), values_of))

    for key in ("advantages", "returns"):  # on generated tokens (verl's GAE leaves values on the others)
        g, w = got.batch[key], want.batch[key] * want.batch["response_mask"]
        assert g[0, :2].tolist() == pytest.approx(w[0, :2].tolist(), abs=1e-5)  # the first row: turn 1
        assert g[1, :6].tolist() == pytest.approx(w[0, 3:9].tolist(), abs=1e-5)  # the second: turns 2 and 3
        assert g[2:, :5].flatten().tolist() == pytest.approx(w[1:, :5].flatten().tolist(), abs=1e-5)  # one-row episodes
    assert got.batch["advantages"][0, :2].abs().sum() > 0
    if estimator == "turn_loo":  # turn 1 is judged against turn 1 of the others, turn 3 against none reached
        adv = got.batch["advantages"]
        assert len({round(float(adv[0, 0]), 4), round(float(adv[1, 0]), 4), round(float(adv[1, 5]), 4)}) == 3


def test_an_agents_requests_and_answers_are_kept_and_compared_on_the_tape():
    """``record.tape.note`` for the gateway's requests: a recording keeps each; a replay that sends the same
    request and gets the same answer (other ids) matches it; another request or another answer is the
    divergence, named with both."""
    from verl_agentic.record import Tape, note, using
    from verl_agentic.tasks.agent import taped_request, without_ids

    body = {"model": "policy", "messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "content": None, "tool_calls": [
                                                {"id": "call_1", "type": "function",
                                                 "function": {"name": "f", "arguments": "{}"}}]},
                                            {"role": "tool", "tool_call_id": "call_1", "content": "4"}]}
    request = taped_request(body, answered=2)
    assert request == {"model": "policy", "messages_before": 2, "messages": [{"role": "tool", "content": "4"}]}
    answer = {"id": "chatcmpl-1", "created": 1, "choices": [{"message": {"role": "assistant", "content": "4"}}]}
    recording = Tape("record")
    with using(recording):
        note("agent_http", request, {"answer": answer}, compared=without_ids)
    assert recording.events == [{"door": "agent_http", "turn": 0, "request": request, "answer": answer}]

    def replayed(req, ans) -> Tape:
        tape = Tape("replay", recording.events)
        with using(tape):
            note("agent_http", req, {"answer": ans}, compared=without_ids)
        return tape

    same = replayed(taped_request({**body, "messages": [*body["messages"][:2], {**body["messages"][2],
                                                                                "tool_call_id": "call_2"}]}, 2),
                    {**answer, "id": "chatcmpl-2", "created": 2})
    assert same.divergence is None and same.unused() == []
    other = replayed({**request, "temperature": 0.3}, answer)
    assert other.divergence["door"] == "agent_http" and "not in the recording" in other.divergence["what"]
    assert other.divergence["got"]["temperature"] == 0.3
    answered_otherwise = replayed(request, {**answer, "choices": [{"message": {"role": "assistant", "content": "5"}}]})
    assert "answer differs" in answered_otherwise.divergence["what"]

    built = []  # a request given as a function is built only where a tape is (the gateway's hot path)

    def build() -> dict:
        built.append(1)
        return request
    note("agent_http", build, {"answer": answer})
    assert built == []
    with using(Tape("record")) as tape:
        note("agent_http", build, {"answer": answer})
    assert built == [1] and tape.events[0]["request"] == request


def test_a_replay_compares_every_row_of_an_episode():
    """replay/compare.py on an episode of two rows: a changed token in the first row is found there (its
    turn counted across the rows), one in the last row at turn 2, and a replay that made fewer rows too."""
    import copy

    from verl_agentic.replay.compare import trajectory_difference

    def row(ids: list[int]) -> dict:
        return {"prompt_ids": [1], "response_ids": ids, "response_mask": [1] * len(ids),
                "response_logprobs": [0.0] * len(ids), "messages": [{"role": "user", "content": "q"},
                                                                    {"role": "assistant", "content": "a"}],
                "turns": [{"role": "assistant", "start": 0, "end": len(ids), "text": "a"}]}

    recorded = {**row([7, 8]), "rows_before": [{**row([5, 6]), "split_reason": "history_changed"}]}
    assert trajectory_difference(recorded, copy.deepcopy(recorded)) is None
    first = copy.deepcopy(recorded)
    first["rows_before"][0]["response_ids"] = [5, 9]
    d = trajectory_difference(recorded, first)
    assert (d["turn"], d["what"]) == (1, "tokens") and d["detail"].startswith("row 0:")
    last = copy.deepcopy(recorded)
    last["response_ids"] = [7, 9]
    d = trajectory_difference(recorded, last)
    assert (d["turn"], d["what"]) == (2, "tokens") and d["detail"].startswith("row 1:")
    fewer = {**copy.deepcopy(recorded["rows_before"][0]), "split_reason": None}
    fewer = {k: v for k, v in fewer.items() if k != "split_reason"}
    d = trajectory_difference(recorded, fewer)
    assert d["detail"] == "the replay made 1 rows, the recording 2"


def test_a_responses_request_becomes_the_chat_request_it_means_and_what_it_cannot_take_is_named():
    from verl_agentic.serving.errors import ServiceError
    from verl_agentic.serving.responses import chat_request, response_object

    body = {"model": "policy", "instructions": "Be brief.", "max_output_tokens": 32, "tool_choice": "auto",
            "tools": [{"type": "function", "name": "calculator", "parameters": {"type": "object"}, "strict": None}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "12*7?"}]},
                      {"type": "reasoning", "id": "rs_1", "summary": []},
                      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me."}]},
                      {"type": "function_call", "call_id": "call_a", "name": "calculator", "arguments": '{"e": 1}'},
                      {"type": "function_call", "call_id": "call_b", "name": "calculator", "arguments": '{"e": 2}'},
                      {"type": "function_call_output", "call_id": "call_a", "output": "84"},
                      {"type": "function_call_output", "call_id": "call_b", "output": "85"},
                      {"role": "developer", "content": "Answer now."}]}
    chat = chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "12*7?"},
        {"role": "assistant", "content": "Let me.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "calculator", "arguments": '{"e": 1}'}},
            {"id": "call_b", "type": "function", "function": {"name": "calculator", "arguments": '{"e": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "84"},
        {"role": "tool", "tool_call_id": "call_b", "content": "85"}, {"role": "system", "content": "Answer now."}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    assert (chat["max_tokens"], chat["tool_choice"], chat["model"]) == (32, "auto", "policy")
    assert chat_request({"model": "policy", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]
    for bad, match in (({"previous_response_id": "resp_1"}, "keeps no responses"),
                       ({"tools": [{"type": "web_search"}]}, "tools\\[0\\] is of type 'web_search'"),
                       ({"input": [{"type": "computer_call"}]}, "input\\[0\\] is of type 'computer_call'"),
                       ({"input": []}, "non-empty")):
        with pytest.raises(ServiceError, match=match):
            chat_request({"model": "policy", "input": "hi", **bad})
    completion = {"id": "c", "model": "policy", "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
                  "choices": [{"index": 0, "finish_reason": "length", "message": {
                      "role": "assistant", "content": "Part", "tool_calls": [
                          {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}
    response = response_object(completion, body)
    assert [o["type"] for o in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == "call_x" and response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"} and response["usage"]["total_tokens"] == 7
