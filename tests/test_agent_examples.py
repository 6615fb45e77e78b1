"""Agent programs nobody here wrote, run unchanged through the gateway (examples/agents/):

- an OpenAI Agents SDK agent (``Agent``, ``Runner``, a ``function_tool``): chosen because it is OpenAI's own
  agent framework, drives the ``openai`` SDK's chat-completions client we hand it, and adds no heavy
  dependencies;
- TextArena's Guess the Number, wrapped as an agent in under 30 lines.

The model is a TEST DOUBLE in both (a scripted calculator policy; a policy that halves the range from the
game's hints), tokenized by the real Qwen2.5 tokenizer: the embedded SmolLM2 neither calls tools nor plays
the game. The frameworks, the gateway, the HTTP, the chat template, the parser and the drift check are real.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import GenOutput
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "agents"))
import calculator_agents_sdk  # noqa: E402,F401 - registers agents_sdk_calculator
import guess_the_number  # noqa: E402,F401 - registers guess_the_number
from va_agents import PROBLEMS, ScriptedCalculatorPolicy  # noqa: E402


class HalvingPolicy(GenerationBackend):
    """TEST DOUBLE: guesses the middle of the range the game's hints leave, as ``[n]``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_token_ids = [self.end_id]

    async def generate(self, prompt_ids, sampling):
        context = self.tokenizer.decode(prompt_ids)
        guesses = [int(g) for g in re.findall(r"<\|im_start\|>assistant\n\[(\d+)\]", context)]
        hints = re.findall(r"The target number is (higher|lower)", context)
        low, high = 1, 20
        for guess, hint in zip(guesses, hints):
            low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
        ids = self.tokenizer.encode(f"[{(low + high) // 2}]", add_special_tokens=False) + [self.end_id]
        return GenOutput(ids, [-0.5] * len(ids), self.tokenizer.decode(ids), "stop")


# the calculator problems as main_rollout preprocesses rows (what an agent receives)
ROWS = [{"prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": a}, "index": i}
        for i, (q, (_, a)) in enumerate(PROBLEMS.items())]


async def _run(policy, task_type: str, rows: list[dict], max_turns: int) -> list[dict]:
    cfg = RolloutConfig(max_turns=max_turns, max_new_tokens=64, max_total_tokens=4096, temperature=1.0, concurrency=4)
    return await AsyncRollout(policy, cfg, seed=0).run([{**r, "task_type": task_type} for r in rows])


async def test_an_openai_agents_sdk_agent_calls_its_tool_and_answers_token_exact(qwen25_tokenizer):
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    trajs = await _run(policy, "agents_sdk_calculator", ROWS, max_turns=4)
    for traj in trajs:
        assert traj["error"] is None and traj["reward"] == 1.0, traj["error"]
        assert traj["metrics"]["agent_calls"] == 2 and traj["metrics"]["agent_rows"] == 1
        # the SDK sent its instructions as a system message, the tool's schema, and the tool's result
        assert traj["messages"][0]["role"] == "system" and traj["tools"][0]["function"]["name"] == "calculator"
        assert [m["role"] for m in traj["messages"][1:]] == ["user", "assistant", "tool", "assistant"]
        assert traj["messages"][3]["content"] in ("84", "28")
        assert check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id]).ok


async def test_textarenas_guess_the_number_plays_through_the_gateway(qwen25_tokenizer):
    policy = HalvingPolicy(qwen25_tokenizer)
    trajs = await _run(policy, "guess_the_number", [{"seed": s, "index": s} for s in range(3)], max_turns=10)
    for traj in trajs:
        assert traj["error"] is None and traj["reward"] == 1.0, traj["error"]
        guesses = traj["metrics"]["guesses"]
        assert 1 <= guesses <= 5 and traj["metrics"]["agent_calls"] == guesses  # halving 1..20 needs at most 5
        assert traj["metrics"]["invalid_move"] == 0.0
        assert "Guess The Number" in traj["messages"][0]["content"]
        assert check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id]).ok


async def streamed_solve(row, client):
    """The same agent run by the SDK's streaming runner (chat completions with stream=true)."""
    from agents import Runner

    result = Runner.run_streamed(calculator_agents_sdk.solver(client), row["prompt"], max_turns=4)
    kinds = [event.type async for event in result.stream_events()]
    answer = str(result.final_output).split("####")[-1].strip()
    return {"reward": float(answer == row["reward_model"]["ground_truth"]),
            "metrics": {"raw_events": float(kinds.count("raw_response_event"))}}


async def test_the_agents_sdk_streaming_runner_reads_the_gateways_chunks(qwen25_tokenizer):
    from verl_agentic.tasks import register_task
    from verl_agentic.tasks.agent import agent_task

    register_task("agents_sdk_streamed", agent_task(streamed_solve), replace=True)
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    trajs = await _run(policy, "agents_sdk_streamed", ROWS, max_turns=4)
    for traj in trajs:
        assert traj["error"] is None and traj["reward"] == 1.0, traj["error"]
        assert traj["metrics"]["agent_calls"] == 2 and traj["metrics"]["raw_events"] >= 4  # chunks of 2 calls
        assert check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id]).ok


def responses_agent(client):
    """The example's agent with the SDK's default model kind, the Responses API (``/v1/responses``)."""
    from agents import Agent, OpenAIResponsesModel

    return Agent(name="solver", instructions="Use the calculator, then answer with '#### <number>'.",
                 tools=[calculator_agents_sdk.calculator],
                 model=OpenAIResponsesModel(model="policy", openai_client=client))


async def responses_solve(row, client):
    from agents import Runner

    result = await Runner.run(responses_agent(client), row["prompt"], max_turns=4)
    answer = str(result.final_output).split("####")[-1].strip()
    return float(answer == row["reward_model"]["ground_truth"])


async def responses_streamed_solve(row, client):
    """The same, run by the streaming runner: ``/v1/responses`` with ``stream=true``."""
    from agents import Runner

    result = Runner.run_streamed(responses_agent(client), row["prompt"], max_turns=4)
    kinds = [event.type async for event in result.stream_events()]
    answer = str(result.final_output).split("####")[-1].strip()
    return {"reward": float(answer == row["reward_model"]["ground_truth"]),
            "metrics": {"raw_events": float(kinds.count("raw_response_event"))}}


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_the_agents_sdk_responses_model_through_the_gateways_responses_route(qwen25_tokenizer, streamed):
    """The Agents SDK's default model kind talks /v1/responses, plain and streamed (the Responses protocol's
    events): its tool call and answer round-trip through the translation, and the episode stays one row
    (the next request's items match what was answered)."""
    from verl_agentic.tasks import register_task
    from verl_agentic.tasks.agent import agent_task

    register_task("agents_sdk_responses", agent_task(responses_streamed_solve if streamed else responses_solve),
                  replace=True)
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    trajs = await _run(policy, "agents_sdk_responses", ROWS, max_turns=4)
    for traj in trajs:
        assert traj["error"] is None and traj["reward"] == 1.0, traj["error"]
        assert traj["metrics"]["agent_calls"] == 2 and traj["metrics"]["agent_rows"] == 1
        if streamed:  # every event of the two streamed responses reached the runner: 7 for the call, 9 for the answer
            assert traj["metrics"]["raw_events"] == 16
        assert [m["role"] for m in traj["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id]).ok
