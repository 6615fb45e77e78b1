"""The agent of tests/test_verl_cpu.py's launches (issue 39), imported by verl's processes through
``+agentic.imports=[va_verl_cpu_agent]`` (the tests folder on ``PYTHONPATH``).

Written with the openai SDK: it asks the row's question, then asks it once more in a fresh conversation,
so every episode makes two training rows (the second call's prompt does not continue the first's). Its
rows keep gsm8k's ``data_source``, so the run's reward manager scores the last answer with gsm8k's scorer;
the reward it returns counts only where no scorer is found.
"""

from __future__ import annotations

from verl_agentic.tasks import register_task
from verl_agentic.tasks.agent import agent_task

TASK = "va_answer_twice"


async def answer_twice(row, client):
    question = row["prompt"][-1]["content"]
    await client.chat.completions.create(model="policy", messages=list(row["prompt"]), max_tokens=24)
    again = [{"role": "user", "content": "Once more: " + question}]
    await client.chat.completions.create(model="policy", messages=again, max_tokens=24)
    return {"reward": 0.0, "metrics": {"sdk_calls": 2}}


register_task(TASK, agent_task(answer_twice), replace=True)
