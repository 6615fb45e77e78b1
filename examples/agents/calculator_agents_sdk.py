"""An OpenAI Agents SDK agent with a function tool, trained unchanged as an agent task.

    python -m verl_agentic.main_rollout imports=[calculator_agents_sdk] task_type=agents_sdk_calculator \
        data.path=examples/agents/problems.jsonl rollout.max_turns=4   # with PYTHONPATH=examples/agents

The agent is the SDK's own ``Agent`` and ``Runner``; only its model is pointed at the episode's client
(``OpenAIChatCompletionsModel``: chat completions, which the gateway serves). Tracing is off: it would
export to OpenAI's servers.
"""

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

from verl_agentic.tasks import register_task
from verl_agentic.tasks.agent import agent_task
from verl_agentic.tools.calculator import evaluate_expression, format_number

set_tracing_disabled(True)


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12*7 and return the value."""
    return format_number(evaluate_expression(expression))


def solver(client) -> Agent:
    return Agent(name="solver", instructions="Use the calculator, then answer with '#### <number>'.",
                 tools=[calculator], model=OpenAIChatCompletionsModel(model="policy", openai_client=client))


async def solve(row, client):
    result = await Runner.run(solver(client), row["prompt"], max_turns=4)  # the dataset row's messages
    answer = str(result.final_output).split("####")[-1].strip()
    right = answer == row["reward_model"]["ground_truth"]
    return {"reward": float(right), "metrics": {"sdk_items": len(result.new_items)}}


register_task("agents_sdk_calculator", agent_task(solve))
