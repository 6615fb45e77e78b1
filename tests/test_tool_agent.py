"""ToolRunner (concurrent calls, timeouts, crashes, parse errors) and the tool_agent task end to end."""

import asyncio
import json
import time

import pytest

from verl_agentic.backends.hf import HFBackend
from verl_agentic.interactions import BaseInteraction, register_interaction
from verl_agentic.interactions.registry import INTERACTION_CLASSES
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.tools import BaseTool, ToolResult, register_tool_class
from verl_agentic.tools.registry import TOOL_CLASSES
from verl_agentic.tools.runner import ToolRunner

EVENTS: list[tuple] = []


def _schema(name, **props):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": list(props)}}}


@register_tool_class("test_sleepy")
class SleepyTool(BaseTool):
    DEFAULT_SCHEMA = _schema("sleepy", seconds="number")

    async def create(self, instance_id=None, **kwargs):
        EVENTS.append(("create", instance_id, kwargs))
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(parameters["seconds"])
        return ToolResult(f"slept {parameters['seconds']}", reward=0.25)

    async def release(self, instance_id, **kwargs):
        EVENTS.append(("release", instance_id))
        await super().release(instance_id)


@register_tool_class("test_broken")
class BrokenTool(BaseTool):
    DEFAULT_SCHEMA = _schema("broken")

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("tool exploded")


def _call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def test_runner_runs_calls_concurrently_and_reports_every_failure_kind():
    tools = [SleepyTool(), BrokenTool()]
    runner = ToolRunner(tools, "hermes", call_timeout_s=1.0)
    await runner.start({"sleepy": {"create_kwargs": {"seed": 7}}})
    assert EVENTS[-1][0] == "create" and EVENTS[-1][2] == {"seed": 7}
    text = "Let me check. " + _call("sleepy", seconds=0.6) + _call("sleepy", seconds=0.6) + _call("broken") + \
        _call("nope") + _call("sleepy", seconds=5) + _call("sleepy") + "<tool_call>{not json</tool_call>"
    t0 = time.perf_counter()
    turn = await runner.run_turn(text)
    wall = time.perf_counter() - t0
    assert wall < 1.6, wall  # the two 0.6 s calls and the 1 s timeout ran side by side
    contents = [m["content"] for m in turn.messages]
    assert [m["role"] for m in turn.messages] == ["tool"] * 6 + ["user"]
    assert contents[0] == contents[1] == "slept 0.6"
    assert "broken raised RuntimeError: tool exploded" in contents[2]
    assert "unknown tool 'nope'" in contents[3] and "sleepy" in contents[3]
    assert "timed out after 1.0 s" in contents[4]
    assert "missing required arguments ['seconds']" in contents[5]
    assert "could not be parsed" in contents[6]
    assert turn.info() == {"tool_calls": [{"name": "sleepy", "status": "ok", "reward": 0.25}] * 2 + [
        {"name": "broken", "status": "error"}, {"name": "nope", "status": "error"},
        {"name": "sleepy", "status": "timeout"}, {"name": "sleepy", "status": "error"}], "parse_errors": 1,
        "invalid_calls": 2}  # 'nope' and the unparseable call
    await runner.close()
    assert EVENTS[-1][0] == "release"
    m = runner.metrics()
    assert m == {"tool_calls": 6.0, "tool_ok": 2.0, "tool_error": 3.0, "tool_timeout": 1.0, "parse_errors": 1.0,
                 "invalid_tool_calls": 2.0, "tool_turns": 1.0, "tool_reward": 0.5}
    # a turn without calls: nothing to append
    no_calls = await runner.run_turn("The answer is 4.")
    assert no_calls.messages == [] and no_calls.info() == {}


def test_templates_without_tool_support_get_a_hermes_system_block(smol_tokenizer, qwen25_tokenizer):
    tools = [SleepyTool().get_openai_tool_schema()]
    msgs = [{"role": "user", "content": "hi"}]
    smol = ChatTemplate(smol_tokenizer)
    assert not smol.supports_tools
    text = smol.render(msgs, add_generation_prompt=True, tools=tools)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "sleepy"' in text and "<tool_call>" in text
    qwen = ChatTemplate(qwen25_tokenizer)
    assert qwen.supports_tools
    assert qwen.render(msgs, add_generation_prompt=True, tools=tools) == qwen25_tokenizer.apply_chat_template(
        msgs, tools=tools, tokenize=False, add_generation_prompt=True)


@register_interaction("test_recording")
class RecordingInteraction(BaseInteraction):
    """Always asks again; records its lifecycle; raises on demand to test finalize."""

    async def start_interaction(self, instance_id=None, **kwargs):
        iid = await super().start_interaction(instance_id, **kwargs)
        EVENTS.append(("start_interaction", iid, kwargs.get("ground_truth")))
        return iid

    async def generate_response(self, instance_id, messages, **kwargs):
        if kwargs.get("explode"):
            raise RuntimeError("interaction exploded")
        return False, "Please double-check.", 0.5, {}

    async def calculate_score(self, instance_id, **kwargs):
        return 0.75

    async def finalize_interaction(self, instance_id, **kwargs):
        EVENTS.append(("finalize", instance_id))
        await super().finalize_interaction(instance_id)


@pytest.fixture(scope="module")
def tiny_backend(tiny_qwen_dir):
    return HFBackend.from_pretrained(tiny_qwen_dir, max_batch_size=16, seed=0)


def _row(uid, **interaction_kwargs):
    return {"uid": uid, "task_type": "tool_agent", "prompt": [{"role": "user", "content": "What is 2+2?"}],
            "reward_model": {"ground_truth": "4"}, "data_source": "openai/gsm8k",
            "extra_info": {"interaction_kwargs": interaction_kwargs}}


def test_tool_agent_episode_with_tools_and_named_interactions(tiny_backend):
    EVENTS.clear()
    task_cfg = {"tool_agent": {"tools": ["test_sleepy"], "call_timeout_s": 5,
                               "interaction": [{"class_name": "test_recording"},
                                               {"name": "retry", "class_name": "gsm8k"}]}}
    rollout = AsyncRollout(tiny_backend, RolloutConfig(max_turns=3, max_new_tokens=10, max_total_tokens=1024,
                                                       temperature=1.0), task_configs=task_cfg, seed=3)
    rows = [_row("a", name="test_recording"), _row("b", name="retry"), _row("c", name="test_recording", explode=True)]
    trajs = rollout.run_sync(rows)
    a, b, c = trajs
    for t in (a, b):
        assert t["error"] is None and t["num_turns"] == 3 and t["finish_reason"] == "max_turns"
        assert t["tools"][0]["function"]["name"] == "sleepy"
        assert "<tools>" in tiny_backend.tokenizer.decode(t["prompt_ids"])  # Qwen2.5 renders tools= itself
        report = check_drift(t, tiny_backend.tokenizer, stop_token_ids=tiny_backend.stop_token_ids)
        assert report.ok, report.as_dict()
    # the named interaction answered: test_recording asks to double-check with 0.5 per turn
    assert [m["content"] for m in a["messages"] if m["role"] == "user"][1:] == ["Please double-check."] * 2
    assert [x.get("reward") for x in a["turns"] if x["role"] == "assistant"] == [0.5, 0.5, 0.5]
    assert a["reward"] == 0.75 and a["metrics"]["feedback_turns"] == 2.0 and a["metrics"]["tool_calls"] == 0.0
    assert "incorrect" in [m["content"] for m in b["messages"] if m["role"] == "user"][1]  # gsm8k retry message
    # a crashing interaction marks only its episode, and finalize still runs
    assert c["error"]["type"] == "task_error" and "interaction exploded" in c["error"]["message"]
    started = {e[1] for e in EVENTS if e[0] == "start_interaction"}
    finalized = {e[1] for e in EVENTS if e[0] == "finalize"}
    assert len(started) == 2 and started == finalized  # a, c (b used the gsm8k interaction)
    assert all(e[2] == "4" for e in EVENTS if e[0] == "start_interaction")  # ground truth passed on
    assert sum(1 for e in EVENTS if e[0] == "create") == sum(1 for e in EVENTS if e[0] == "release") == 3


def test_tool_agent_config_errors_come_before_generation(tiny_backend):
    from verl_agentic.interfaces import ConfigError

    with pytest.raises(ConfigError, match="unknown tool class 'nope'"):
        AsyncRollout(tiny_backend, RolloutConfig(), task_configs={"tool_agent": {"tools": ["nope"]}}).run_sync(
            [_row("x")])
    with pytest.raises(ConfigError, match="unknown task.tool_agent keys \\['tool'\\]"):
        AsyncRollout(tiny_backend, RolloutConfig(), task_configs={"tool_agent": {"tool": []}}).run_sync([_row("x")])


def test_unknown_interaction_name_marks_the_episode_listing_configured(tiny_backend):
    cfg = {"tool_agent": {"interaction": [{"class_name": "gsm8k"}]}}
    (t,) = AsyncRollout(tiny_backend, RolloutConfig(max_new_tokens=4), task_configs=cfg).run_sync(
        [_row("x", name="verify")])
    assert t["error"]["type"] == "task_error" and "unknown interaction 'verify'; configured: gsm8k" in t["error"]["message"]


def teardown_module():
    for name in ("test_sleepy", "test_broken"):
        TOOL_CLASSES.unregister(name)
    INTERACTION_CLASSES.unregister("test_recording")


def test_python_code_parser_turns_fenced_blocks_into_python_calls():
    from verl_agentic.tools.parsers import get_parser

    p = get_parser("python_code")
    r = p.parse("Let me verify.\n```python\nprint(6 * 7)\n```\nSo #### 42\n```py\nx = 1\n")
    assert [(c.name, c.arguments) for c in r.calls] == [("python", {"code": "print(6 * 7)"})]
    assert r.content == "Let me verify.\n\nSo #### 42"
    assert [e.type for e in r.errors] == ["unclosed_tag"]  # a block cut off by the token limit
    assert "```python\nprint(6 * 7)\n```" in p.feedback_message(r.errors)
    again = p.parse(p.format_calls(r.calls, "ok"))
    assert again.calls[0].arguments == r.calls[0].arguments and again.content == "ok"
    assert get_parser("python_code", tool_name="exec", argument="src").parse("```python\n1\n```").calls[0].name == "exec"
    assert p.parse("```\nnot python\n```").calls == []  # only python fences


def test_gsm8k_rows_that_name_an_interaction_use_it(tiny_backend):
    """verl's convention: a row's interaction_kwargs.name picks the interaction, even with no config."""
    row = {"uid": "g", "task_type": "gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}],
           "reward_model": {"ground_truth": "4"}, "data_source": "openai/gsm8k",
           "extra_info": {"interaction_kwargs": {"name": "code_verify"}}}
    plain = dict(row, uid="p", extra_info={})
    rollout = AsyncRollout(tiny_backend, RolloutConfig(max_turns=3, max_new_tokens=8, max_total_tokens=1024),
                           task_configs={"gsm8k": {"feedback": "retry"}}, seed=0)
    named, builtin = rollout.run_sync([row, plain])
    named_users = [m["content"] for m in named["messages"] if m["role"] == "user"][1:]
    assert named_users and named_users[0] == "Are you sure? Can you write Python code to verify?"
    builtin_users = [m["content"] for m in builtin["messages"] if m["role"] == "user"][1:]
    assert builtin_users and builtin_users[0].startswith("Your answer is incorrect")  # the built-in retry policy


async def test_cancelled_episode_still_finalizes_interaction_and_releases_tools(tiny_backend):
    EVENTS.clear()
    cfg = {"tool_agent": {"tools": ["test_sleepy"], "interaction": [{"class_name": "test_recording"}]}}
    rollout = AsyncRollout(tiny_backend, RolloutConfig(max_turns=50, max_new_tokens=64, max_total_tokens=100_000),
                           task_configs=cfg, seed=0)
    task = asyncio.ensure_future(rollout.run([_row("k", name="test_recording")]))
    deadline = time.monotonic() + 30
    while not any(e[0] == "start_interaction" for e in EVENTS):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e[0] for e in EVENTS].count("finalize") == 1 and [e[0] for e in EVENTS].count("release") == 1
