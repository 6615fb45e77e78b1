"""The chat loop (``openai_chat_agent_loop``) and ``ChatAdapter`` on real tokenizers and a real (tiny) model:
tool-call parsing into OpenAI messages, template rendering of chat messages, token exactness of the
dump, the re-render measurement against a direct recomputation, text-only backends and failures."""

import json

import pytest

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.backends.chat_adapter import ChatAdapter, chat_output, has_native_chat, to_template_messages
from verl_agentic.backends.hf import HFBackend
from verl_agentic.interfaces import ChatOutput, EpisodeResult, EpisodeState, GenOutput, Observation
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift
from verl_agentic.rollout.chat_loop import differing_tokens, openai_chat_agent_loop
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.tasks import TaskSpec, register_task
from verl_agentic.tools.parsers import get_parser

CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                         "parameters": {"type": "object", "properties": {
                                             "expression": {"type": "string"}}, "required": ["expression"]}}}
SEEN: list[object] = []  # what obs() received


def _start(row, ctx):
    return EpisodeState(row=row, messages=[dict(m) for m in row["prompt"]], ctx=ctx, tools=row.get("tools"))


def _obs(state, out):
    SEEN.append(out)
    if state.row.get("explode"):
        raise RuntimeError("boom")
    return Observation(messages=[{"role": "user", "content": f"Turn {state.num_turns} done. Go on."}],
                       turn_reward=float(state.num_turns))


def _end(state):
    return EpisodeResult(reward=float(state.num_turns))


_SPEC = dict(start=_start, obs=_obs, end=_end)
register_task("_t_chat", TaskSpec(**_SPEC, loop=openai_chat_agent_loop), replace=True)
register_task("_t_ids", TaskSpec(**_SPEC), replace=True)


@pytest.fixture(scope="module")
def tiny_backend(tiny_qwen_dir):
    return HFBackend.from_pretrained(tiny_qwen_dir, max_batch_size=16, seed=0)


def _rows(task, n, **extra):
    return [{"uid": f"r{i}", "task_type": task, "prompt": [{"role": "user", "content": f"Count to {i + 2}."}],
             "reward_model": {"ground_truth": "0"}, **extra} for i in range(n)]


def _rollout(backend, **kw):
    cfg = dict(max_turns=3, max_new_tokens=8, max_total_tokens=1024, temperature=0.0, concurrency=16)
    cfg.update(kw)
    return AsyncRollout(backend, RolloutConfig(**cfg), seed=5)


def test_chat_output_parses_tool_calls_and_keeps_the_generated_ids(qwen25_tokenizer):
    tok = qwen25_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    ids = tok(text, add_special_tokens=False)["input_ids"] + [im_end]
    out = GenOutput(ids, [-0.5] * len(ids), tok.decode(ids), "stop")
    chat = chat_output(out, tok, {im_end}, get_parser("hermes"), prompt_token_count=17)
    assert chat.message == {"role": "assistant", "content": "Let me compute.", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]}
    assert chat.finish_reason == "tool_calls" and chat.token_ids == ids and chat.logprobs == out.logprobs
    assert chat.prompt_token_count == 17
    # no tools offered: no parsing; a broken call: the raw text, as OpenAI-compatible servers answer it
    assert chat_output(out, tok, {im_end}, None).message == {"role": "assistant", "content": text}
    broken = text.replace("}}\n</tool_call>", "}\n</tool_call>")
    bids = tok(broken, add_special_tokens=False)["input_ids"]  # cut off: no stop token
    chat = chat_output(GenOutput(bids, None, broken, "length"), tok, {im_end}, get_parser("hermes"))
    assert chat.message == {"role": "assistant", "content": broken} and chat.finish_reason == "length"


def test_chat_messages_render_as_the_template_expects(qwen25_tokenizer, smol_tokenizer):
    messages = [{"role": "user", "content": "6*7?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]},
                {"role": "tool", "content": "42", "tool_call_id": "call_0"}]
    hermes = get_parser("hermes")
    qwen = ChatTemplate(qwen25_tokenizer)
    rendered = qwen.render(to_template_messages(messages, qwen, hermes), add_generation_prompt=True, tools=[CALC])
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in rendered and "<tool_response>\n42\n</tool_response>" in rendered
    # the OpenAI form as is would be double-encoded by the template: why the conversion exists
    assert '"arguments": "{\\"expression' in qwen.render(messages[:2], add_generation_prompt=False, tools=[CALC])
    smol = ChatTemplate(smol_tokenizer)  # no tool support: the call goes into the content, in hermes format
    assert not smol.supports_tools
    rendered = smol.render(to_template_messages(messages, smol, hermes), add_generation_prompt=True, tools=[CALC])
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in rendered and "<tools>" in rendered
    assert messages[1]["content"] is None and "arguments" in messages[1]["tool_calls"][0]["function"]  # not mutated


def test_chat_loop_dump_is_token_exact_and_rerender_drift_is_measured(tiny_backend):
    SEEN.clear()
    n = 10
    chat = _rollout(tiny_backend).run_sync(_rows("_t_chat", n))
    assert all(isinstance(o, ChatOutput) for o in SEEN) and len(SEEN) == 3 * n  # obs gets the chat answer
    ids = _rollout(tiny_backend).run_sync(_rows("_t_ids", n))
    renderer = ChatAdapter(tiny_backend, "hermes", ChatTemplate(tiny_backend.tokenizer))
    exact = 0
    for c, t in zip(chat, ids):
        assert c["error"] is None and c["num_turns"] == 3 and c["finish_reason"] == "max_turns"
        report = check_drift(c, tiny_backend.tokenizer, stop_token_ids=tiny_backend.stop_token_ids)
        assert report.ok, report.as_dict()
        assert [x.get("reward") for x in c["turns"] if x["role"] == "assistant"] == [1.0, 2.0, 3.0]
        # recompute what a chat server rendered before each turn and compare with the dumped context
        n_prompt = len(c["messages"]) - sum(x.get("num_messages", 1) for x in c["turns"])
        turns_seen, tokens_seen, msg_cursor = 0, 0, n_prompt
        for turn in c["turns"]:
            if turn["role"] != "assistant":
                msg_cursor += turn["num_messages"]
                continue
            served = renderer.render_prompt_ids(c["messages"][:msg_cursor])
            context = c["prompt_ids"] + c["response_ids"][:turn["start"]]
            diff = differing_tokens(served, context)
            turns_seen += diff > 0
            tokens_seen += diff
            msg_cursor += 1
        assert (c["metrics"]["chat_rerender_turns"], c["metrics"]["chat_rerender_tokens"]) == (turns_seen, tokens_seen)
        if tokens_seen == 0:  # the server saw exactly the dumped context: token for token the ids loop's episode
            exact += 1
            assert c["response_ids"] == t["response_ids"] and c["response_mask"] == t["response_mask"]
            assert c["response_logprobs"] == pytest.approx(t["response_logprobs"], abs=1e-4)  # other batch shapes
            assert c["messages"] == t["messages"]
    assert 0 < exact < n, exact  # a random model's text re-encodes differently now and then: both cases occur


class FakeTextOnlyChatServer(GenerationBackend):
    """A chat backend that reports no token ids (as chat-only APIs do): the adapter's answers, ids dropped."""

    def __init__(self, inner, fail=False):
        self.adapter = ChatAdapter(inner)
        self.tokenizer, self.stop_token_ids, self.fail = inner.tokenizer, inner.stop_token_ids, fail

    async def generate(self, prompt_ids, sampling):
        raise AssertionError("a chat-only server has no token endpoint")

    async def chat(self, messages, sampling, tools=None):
        if self.fail:
            raise ConnectionError("server went away")
        out = await self.adapter.chat(messages, sampling, tools)
        return ChatOutput(out.message, out.finish_reason)


def test_backends_without_token_ids_give_text_only_trajectories(tiny_backend):
    fake = FakeTextOnlyChatServer(tiny_backend)
    assert has_native_chat(fake) and not has_native_chat(tiny_backend)
    trajs = _rollout(fake).run_sync(_rows("_t_chat", 2))
    for t in trajs:
        assert t["error"] is None and t["num_turns"] == 3 and t["metrics"]["chat_text_only"] == 1.0
        assert t["prompt_ids"] == t["response_ids"] == t["response_mask"] == t["response_logprobs"] == []
        assert all(x["start"] == x["end"] == 0 for x in t["turns"])
        assert [m["role"] for m in t["messages"]] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert [x["text"] for x in t["turns"] if x["role"] == "assistant"] == \
            [m["content"] for m in t["messages"] if m["role"] == "assistant"]
        assert check_drift(t, tiny_backend.tokenizer).ok


def test_failures_are_typed_and_keep_the_episode(tiny_backend):
    down, boom = _rollout(FakeTextOnlyChatServer(tiny_backend, fail=True)).run_sync(_rows("_t_chat", 1))[0], \
        _rollout(tiny_backend).run_sync(_rows("_t_chat", 1, explode=True))[0]
    assert down["error"]["type"] == "generation_error" and "ConnectionError: server went away" in down["error"]["message"]
    assert boom["error"] == {"type": "task_error", "message": "obs: RuntimeError: boom"}
    assert boom["num_turns"] == 1 and sum(boom["response_mask"]) > 0 and boom["messages"][-1]["role"] == "assistant"
    assert check_drift(boom, tiny_backend.tokenizer, stop_token_ids=tiny_backend.stop_token_ids).ok
    assert json.loads(json.dumps(boom)) == boom  # the dump stays plain JSON
