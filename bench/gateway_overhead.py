"""The gateway's own cost: one conversation as an agent task and as a start / obs / end task (issue 39).

    .venv/bin/python bench/gateway_overhead.py [--episodes 64] [--repeats 3] [--out bench/gateway/overhead.json]

The conversation, written both ways: the user's question, a calculator call, the tool's value, the answer
(two model calls an episode):

- ``task``: the built-in ``tool_agent`` task with the ``calculator`` tool (start / obs / end in the rollout's
  own loop; the model is called directly by the task's ``gen``);
- ``agent``: the same conversation as an ``openai`` SDK agent (``AsyncOpenAI`` through the gateway, the
  calculator run by the agent).

The model is a STAND-IN (``InstantPolicy``): a fixed reply per turn (the calculator call, then the answer),
tokenized once by the real Qwen2.5 tokenizer, with no compute; so what differs between the two ways is the
gateway (the SDK, HTTP on loopback, JSON, the hand-off between the agent and the loop), not the model. With
a real engine the same milliseconds add to each call's generation time.

Per call, the latency the caller sees: the task's ``gen`` around the engine call; the agent's SDK call.
Per run: episodes per second. At concurrency 1 and 32, the two ways interleaved (task, agent, agent, task,
...) ``--repeats`` times in one process; every run is kept in the json. Prints the medians over the repeats
and the ratio agent / task; the commit (and whether the tree was clean) goes with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QWEN = REPO / "tests" / "assets" / "tokenizers" / "qwen2.5-instruct"
QUESTION = "A baker makes 12 loaves a day. How many loaves does he make in 7 days?"


class InstantPolicy:
    """STAND-IN for the model: the calculator call on the first turn, the answer after the tool's reply
    (told apart by ``<tool_response>`` near the end of the context); each reply ends with ``<|im_end|>``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_token_ids = [self.end_id]
        call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
        self.replies = [tokenizer.encode(text, add_special_tokens=False) + [self.end_id]
                        for text in (call, "He makes 84 loaves.\n#### 84")]
        self.calls: list[float] = []  # seconds of each engine call (what the task's gen waits for)

    async def generate(self, prompt_ids, sampling):
        from verl_agentic.interfaces import GenOutput

        t0 = time.perf_counter()
        ids = self.replies[int("<tool_response>" in self.tokenizer.decode(prompt_ids[-24:]))]
        out = GenOutput(list(ids), [-0.5] * len(ids), "", "stop")
        self.calls.append(time.perf_counter() - t0)
        return out


CALLS: list[float] = []  # seconds of each SDK call the agent made


async def calculator_agent(row, client):
    from verl_agentic.tools.calculator import CalculatorTool, evaluate_expression, format_number

    schema = CalculatorTool().get_openai_tool_schema()
    schema = schema.model_dump(exclude_none=True) if hasattr(schema, "model_dump") else schema
    messages = list(row["prompt"])
    while True:
        t0 = time.perf_counter()
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[schema])
        CALLS.append(time.perf_counter() - t0)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 1.0
        for call in message.tool_calls:
            value = format_number(evaluate_expression(json.loads(call.function.arguments)["expression"]))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": value})


def one_run(way: str, policy: InstantPolicy, episodes: int, concurrency: int) -> dict:
    from verl_agentic.rollout import AsyncRollout, RolloutConfig

    rows = [{"task_type": "bench_calculator_agent" if way == "agent" else "tool_agent",
             "prompt": [{"role": "user", "content": QUESTION}], "reward_model": {"ground_truth": "84"},
             "data_source": "bench", "index": i} for i in range(episodes)]
    cfg = RolloutConfig(max_turns=3, max_new_tokens=64, max_total_tokens=2048, temperature=1.0,
                        concurrency=concurrency)
    policy.calls.clear()
    CALLS.clear()
    t0 = time.perf_counter()
    trajs = AsyncRollout(policy, cfg, seed=0, progress=False,
                         task_configs={"tool_agent": {"tools": ["calculator"]}}).run_sync(rows)
    wall = time.perf_counter() - t0
    bad = [t["error"] for t in trajs if t["error"] is not None or t["num_turns"] != 2]
    if bad:
        raise SystemExit(f"{way}: {len(bad)} episodes did not make two calls, e.g. {bad[0]}")
    calls = CALLS if way == "agent" else policy.calls  # the task's gen calls the engine directly
    ms = sorted(1000 * c for c in calls)
    return {"way": way, "concurrency": concurrency, "episodes": episodes, "calls": len(ms), "wall_s": wall,
            "episodes_per_s": episodes / wall, "call_ms_p50": statistics.median(ms),
            "call_ms_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--out", default=str(REPO / "bench" / "gateway" / "overhead.json"))
    a = p.parse_args()

    from transformers import AutoTokenizer

    from verl_agentic.provenance import source_state
    from verl_agentic.tasks import register_task
    from verl_agentic.tasks.agent import agent_task

    register_task("bench_calculator_agent", agent_task(calculator_agent))
    policy = InstantPolicy(AutoTokenizer.from_pretrained(str(QWEN)))
    one_run("agent", policy, 4, 4)  # warm-up: imports, the gateway's first start
    one_run("task", policy, 4, 4)
    runs = []
    for concurrency in (int(c) for c in a.concurrency.split(",")):
        for r in range(a.repeats):
            for way in (("task", "agent") if r % 2 == 0 else ("agent", "task")):
                runs.append(one_run(way, policy, a.episodes, concurrency))
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in runs[-1].items()}),
                      flush=True)
    table = []
    for concurrency in sorted({r["concurrency"] for r in runs}):
        med = {way: {k: statistics.median(r[k] for r in runs if r["way"] == way and r["concurrency"] == concurrency)
                     for k in ("episodes_per_s", "call_ms_p50", "call_ms_p99")} for way in ("task", "agent")}
        table.append({"concurrency": concurrency, **{f"{w}_{k}": v for w in med for k, v in med[w].items()},
                      "agent_over_task_episodes_per_s": med["agent"]["episodes_per_s"] / med["task"]["episodes_per_s"],
                      "overhead_ms_p50": med["agent"]["call_ms_p50"] - med["task"]["call_ms_p50"]})
    state = source_state(allow_dirty=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({**state, "command": " ".join(sys.argv), "runs": runs, "table": table},
                                      indent=1))
    print(f"commit {state['commit'][:7]}{' (dirty: ' + ', '.join(state['dirty']) + ')' if state['dirty'] else ''}")
    print("| concurrency | task eps/s | agent eps/s | agent / task | task call p50 / p99 ms | agent call p50 / p99 ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in table:
        print(f"| {t['concurrency']} | {t['task_episodes_per_s']:.1f} | {t['agent_episodes_per_s']:.1f} | "
              f"{t['agent_over_task_episodes_per_s']:.2f}x | {t['task_call_ms_p50']:.2f} / {t['task_call_ms_p99']:.2f} | "
              f"{t['agent_call_ms_p50']:.2f} / {t['agent_call_ms_p99']:.2f} |")


if __name__ == "__main__":
    main()
