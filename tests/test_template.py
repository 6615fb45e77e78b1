"""Observation deltas against the real chat templates (SmolLM2, Qwen2.5, Qwen3), token by token."""

import pytest

from verl_agentic.interfaces import EpisodeFailure
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.rollout.trajectory import check_drift


def _simulate(tokenizer, prompt_messages, turns, kwargs=None, tools=None):
    """Build a trajectory as the loop does, with "generated" ids = encode(text) + <|im_end|>.

    ``turns``: alternating assistant text and lists of observation messages.
    """
    t = ChatTemplate(tokenizer, kwargs)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = [dict(m) for m in prompt_messages]
    prompt_ids = t.prompt_ids(messages, tools)
    resp, mask, traj_turns = [], [], []
    for item in turns:
        start = len(resp)
        if isinstance(item, str):
            ids = t.encode(item) + [eos]
            resp += ids
            mask += [1] * len(ids)
            messages.append({"role": "assistant", "content": item})
            traj_turns.append({"role": "assistant", "start": start, "end": len(resp), "text": item,
                               "finish_reason": "stop"})
        else:
            delta = t.delta_text(messages, item, generated_stop_text="<|im_end|>", tools=tools)
            ids = t.encode(delta)
            resp += ids
            mask += [0] * len(ids)
            messages.extend(item)
            traj_turns.append({"role": item[0]["role"], "start": start, "end": len(resp), "text": delta,
                               "num_messages": len(item)})
    traj = {"uid": "u", "sample_id": 0, "prompt_ids": prompt_ids, "response_ids": resp, "response_mask": mask,
            "response_logprobs": [0.0 if m else None for m in mask], "messages": messages, "turns": traj_turns,
            "error": None}
    if tools:
        traj["tools"] = tools
    return traj


FEEDBACK = [{"role": "user", "content": "Are you sure? Can you write Python code to verify?"}]
CONVERSATION = ["Let me think. 3 + 4 = 7.\n#### 7", FEEDBACK, "Yes:\n```python\nprint(3 + 4)\n```\n#### 7",
                [{"role": "user", "content": "Your answer is incorrect."}], "Then #### 8"]


@pytest.mark.parametrize("tok_fixture", ["smol_tokenizer", "qwen25_tokenizer"])
def test_append_only_templates_match_full_rendering_exactly(tok_fixture, request):
    tok = request.getfixturevalue(tok_fixture)
    prompt = [{"role": "user", "content": "What is 3 + 4?"}]
    traj = _simulate(tok, prompt, CONVERSATION)
    # the whole token sequence equals the template applied to the final conversation
    full = tok.apply_chat_template(traj["messages"], tokenize=False, add_generation_prompt=False)
    expected = tok(full, add_special_tokens=False)["input_ids"]
    got = traj["prompt_ids"] + traj["response_ids"]
    # the template closes the last turn with "\n" that is not part of the trajectory
    assert got == expected[: len(got)] and len(expected) - len(got) == 1
    report = check_drift(traj, tok)
    assert report.ok and not report.rerender and report.reencode_changed == 0
    assert report.injected_tokens == sum(1 - m for m in traj["response_mask"])


def test_injected_span_starts_after_generated_end_of_turn(smol_tokenizer):
    traj = _simulate(smol_tokenizer, [{"role": "user", "content": "hi"}], CONVERSATION[:3])
    first_injected = traj["turns"][1]
    # the model generated <|im_end|>; the delta begins with the template's newline, not a second <|im_end|>
    assert smol_tokenizer.decode(traj["response_ids"][first_injected["start"]:][:1]) == "\n"
    assert traj["response_ids"][first_injected["start"] - 1] == smol_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_truncated_turn_gets_end_of_turn_inserted(qwen25_tokenizer):
    t = ChatTemplate(qwen25_tokenizer)
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "cut of"}]
    delta = t.delta_text(history, FEEDBACK)  # no generated stop text: the turn was cut off
    assert delta.startswith("<|im_end|>\n<|im_start|>user\nAre you sure?")
    assert delta.endswith("<|im_start|>assistant\n")


def test_qwen25_tool_responses_grouped_in_context(qwen25_tokenizer):
    tools = [{"type": "function", "function": {"name": "python", "description": "run code",
                                                "parameters": {"type": "object", "properties": {}}}}]
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(7)"}}\n</tool_call>'
    tool_msgs = [{"role": "tool", "content": "7"}, {"role": "tool", "content": "ok"}]
    traj = _simulate(qwen25_tokenizer, [{"role": "user", "content": "3+4?"}], [call, tool_msgs, "#### 7"], tools=tools)
    delta = traj["turns"][1]["text"]
    assert delta == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response>\n<tool_response>\nok\n"
                     "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "# Tools" in qwen25_tokenizer.decode(traj["prompt_ids"])
    report = check_drift(traj, qwen25_tokenizer)
    assert report.ok and not report.rerender


def test_qwen3_history_rewriting_is_reported_but_not_applied(qwen3_tokenizer):
    """Qwen3 drops earlier <think> blocks when re-rendering; the rollout keeps what the model saw."""
    turns = ["<think>\n3 plus 4\n</think>\n\n#### 7", FEEDBACK, "<think>\nsure\n</think>\n\n#### 7"]
    traj = _simulate(qwen3_tokenizer, [{"role": "user", "content": "3+4?"}], turns)
    report = check_drift(traj, qwen3_tokenizer)
    assert report.ok  # every injected span is what the template renders in its context
    # a fresh rendering of the final conversation differs for the last assistant's preamble
    assert report.rerender and report.rerender_differing_tokens > 0
    # with thinking disabled, generation prompts carry the empty think block
    t = ChatTemplate(qwen3_tokenizer, {"enable_thinking": False})
    assert t.render([{"role": "user", "content": "x"}], add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    traj2 = _simulate(qwen3_tokenizer, [{"role": "user", "content": "3+4?"}], ["#### 7", FEEDBACK, "#### 7"],
                      kwargs={"enable_thinking": False})
    assert check_drift(traj2, qwen3_tokenizer, {"enable_thinking": False}).ok


def test_drift_check_catches_a_wrong_injected_token_and_bad_mask(qwen25_tokenizer):
    traj = _simulate(qwen25_tokenizer, [{"role": "user", "content": "q"}], CONVERSATION[:3])
    span = traj["turns"][1]
    bad = dict(traj, response_ids=list(traj["response_ids"]))
    bad["response_ids"][span["start"] + 2] += 1
    report = check_drift(bad, qwen25_tokenizer)
    assert not report.ok and report.injected[0].position == span["start"] + 2
    assert report.injected_differing_tokens == 1
    bad_mask = dict(traj, response_mask=list(traj["response_mask"]))
    bad_mask["response_mask"][span["start"]] = 1
    report = check_drift(bad_mask, qwen25_tokenizer)
    assert not report.ok and "response_mask must be 0" in report.structure[0]


def test_reencode_diagnostic_counts_non_canonical_tokenization(qwen25_tokenizer):
    traj = _simulate(qwen25_tokenizer, [{"role": "user", "content": "q"}], ["hello world"])
    # a non-canonical split of "hello" ("hel" + "lo") that a model may sample but re-encoding merges
    ids = qwen25_tokenizer("hel", add_special_tokens=False)["input_ids"] + \
        qwen25_tokenizer("lo", add_special_tokens=False)["input_ids"]
    eos = qwen25_tokenizer.convert_tokens_to_ids("<|im_end|>")
    traj["response_ids"] = ids + [eos]
    traj["response_mask"] = [1] * len(traj["response_ids"])
    traj["response_logprobs"] = [0.0] * len(traj["response_ids"])
    traj["turns"][0]["end"] = len(traj["response_ids"])
    traj["messages"][-1]["content"] = "hello"
    report = check_drift(traj, qwen25_tokenizer)
    assert report.ok and report.reencode_changed == 2 and report.generated_tokens == 3


def test_template_errors_are_typed(qwen25_tokenizer):
    t = ChatTemplate(qwen25_tokenizer)
    with pytest.raises(EpisodeFailure) as e:
        t.render([{"role": "user"}], add_generation_prompt=True)  # no content
    assert e.value.type == "template_error"
    with pytest.raises(ValueError, match="must end with the assistant message"):
        t.delta_text([{"role": "user", "content": "x"}], FEEDBACK)
