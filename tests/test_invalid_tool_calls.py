"""The invalid-tool-call policy (``max_consecutive_invalid_tool_calls``, tools/runner.py).

The real runs use the embedded SmolLM2 greedily, asked for Python code, with the ``python_code``
parser and only the ``calculator`` tool: every fenced block it writes is a call to the unknown tool
``python`` (the tool's error goes back, it writes the block again), so the policy meets real invalid
calls from a real model. Covered: the runner's count, ``main_rollout`` (a real process),
``main_ppo`` (a real training step); verl's agent-loop path is in tests/test_verl_agent_loop.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from va_testing import REPO
from verl_agentic.interfaces import FINISH_INVALID_TOOL_CALLS, ConfigError, EpisodeFailure
from verl_agentic.tools import load_tools
from verl_agentic.tools.runner import ToolRunner, invalid_call_limit

CALL = '<tool_call>{{"name": "{name}", "arguments": {{"expression": "1+1"}}}}</tool_call>'
BROKEN = "<tool_call>{not json</tool_call>"
EXAMPLE = REPO / "examples" / "invalid_tool_calls"
SMOL_TOOL_ARGS = ["task_type=tool_agent", "rollout.max_turns=4", "rollout.max_new_tokens=96", "rollout.temperature=0",
                  "task.tool_agent.tools=[calculator]", "task.tool_agent.parser=python_code"]


def _turns(runner: ToolRunner, texts: list[str]) -> list:
    async def go():
        await runner.start()
        try:
            return [await runner.run_turn(t) for t in texts]
        finally:
            await runner.close()

    return asyncio.run(go())


def test_the_runner_counts_invalid_calls_in_a_row_and_ends_the_episode_at_the_limit():
    tools = load_tools(["calculator"])
    # unknown tool, unparseable markup: 2 in a row -> the episode ends on the second, with that turn's facts
    with pytest.raises(EpisodeFailure) as e:
        _turns(ToolRunner(tools, "hermes", max_consecutive_invalid=2), [CALL.format(name="python"), BROKEN])
    assert e.value.type == "invalid_tool_calls"
    assert "2 invalid tool calls in a row" in e.value.message and "unparseable call (invalid_json)" in e.value.message
    assert e.value.info == {"parse_errors": 1, "invalid_calls": 1}
    # a valid call between them resets the count; a turn without calls leaves it
    runner = ToolRunner(tools, "hermes", max_consecutive_invalid=2)
    turns = _turns(runner, [CALL.format(name="python"), CALL.format(name="calculator"), BROKEN, "no call here"])
    assert [t.invalid for t in turns] == [1, 0, 1, 0] and runner.invalid_streak == 1
    assert runner.metrics()["invalid_tool_calls"] == 2 and runner.metrics()["parse_errors"] == 1
    # without a limit nothing ends, however many
    unlimited = ToolRunner(tools, "hermes")
    assert len(_turns(unlimited, [BROKEN] * 5)) == 5 and unlimited.metrics()["invalid_tool_calls"] == 5


def test_the_limit_is_the_tasks_key_else_the_rollouts_default():
    class Ctx:
        max_consecutive_invalid_tool_calls = 3

    assert invalid_call_limit(None, Ctx(), "task.x") == 3
    assert invalid_call_limit(2, Ctx(), "task.x") == 2
    assert invalid_call_limit(0, Ctx(), "task.x") is None  # 0: no limit, whatever the rollout says
    assert invalid_call_limit(None, None, "task.x") is None
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="task.x.max_consecutive_invalid_tool_calls must be an integer >= 0"):
            invalid_call_limit(bad, None, "task.x")
    from verl_agentic.main_rollout import load_config
    from verl_agentic.config import RunConfig

    with pytest.raises(ConfigError, match="rollout.max_consecutive_invalid_tool_calls must be >= 0"):
        RunConfig.parse(load_config(["rollout.max_consecutive_invalid_tool_calls=-2"]))
    from verl_agentic.tasks.tool_agent import ToolAgentConfig

    with pytest.raises(ConfigError, match="task.tool_agent.max_consecutive_invalid_tool_calls"):
        ToolAgentConfig.from_dict({"tools": ["calculator"], "max_consecutive_invalid_tool_calls": -1})


@pytest.fixture(scope="module")
def questions():
    return EXAMPLE / "questions.jsonl"


def _rollout(out, questions, *extra) -> list[dict]:
    """examples/invalid_tool_calls/run.sh (its command: the rollout default of 2), with ``extra``."""
    r = subprocess.run(["bash", str(EXAMPLE / "run.sh"), f"output.dir={out}", "output.quiet=true", *extra],
                       capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()], json.loads(
        (out / "summary.json").read_text())


def test_main_rollout_ends_episodes_of_real_invalid_calls_with_their_own_finish_reason(questions, tmp_path, smol_dir):
    trajs, summary = _rollout(tmp_path / "limited", questions)
    for t in trajs:
        assert t["finish_reason"] == FINISH_INVALID_TOOL_CALLS and t["error"]["type"] == "invalid_tool_calls"
        assert t["num_turns"] == 2 and t["metrics"]["invalid_tool_calls"] == 2
        # the turn that ended it keeps its facts: a call to the unknown tool 'python'
        assert t["turns"][-1]["info"]["tool_calls"] == [{"name": "python", "status": "error"}]
        assert [m["role"] for m in t["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert "unknown tool 'python'" in t["messages"][2]["content"]  # the model was told, once
    task = summary["tasks"]["tool_agent"]
    assert task["finish_reasons"] == {"invalid_tool_calls": 2} and task["errors"] == {"invalid_tool_calls": 2}
    assert summary["drift"]["episodes_ok"] == 2  # token exactness holds on the cut episodes
    # the task's key wins over the rollout's default: 0 = no limit, the episodes run to max_turns
    trajs, _ = _rollout(tmp_path / "unlimited", questions, "task.tool_agent.max_consecutive_invalid_tool_calls=0")
    assert [t["finish_reason"] for t in trajs] == ["max_turns", "max_turns"]
    assert all(t["metrics"]["invalid_tool_calls"] == 4 for t in trajs)


def test_main_ppo_trains_on_them_and_counts_them_per_task(questions, tmp_path, smol_dir):
    from verl_agentic.main_rollout import load_config
    from verl_agentic.trainer import PPOTrainer

    cfg = load_config([f"data.path={questions}", *SMOL_TOOL_ARGS, "task.tool_agent.max_consecutive_invalid_tool_calls=2",
                       "rollout.n=2", "trainer.batch_size=2", "trainer.total_steps=1", "actor.ppo_mini_batch_size=4",
                       "actor.ppo_micro_batch_size=4", "reward.manager=none", "trainer.save_hf_model=false",
                       f"output.dir={tmp_path}", "output.quiet=true"], config_name="ppo")
    (m,) = PPOTrainer(cfg).fit()
    assert m["episode/invalid_tool_call_stops"] == 4 and m["tool/invalid_calls"] == 8
    episodes = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert [e["finish_reason"] for e in episodes] == [FINISH_INVALID_TOOL_CALLS] * 4
    assert m["episode/errors"] == 4 and m["response_length/mean"] > 0  # kept and trained on, not dropped
