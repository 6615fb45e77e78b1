"""Chat mode vs token mode on the same model: how many episodes come out token for token the same.

The same GSM8K rows are rolled out twice with one backend: by the ``gsm8k`` task (``ids_agent_loop``,
the model continues its own token context) and by the same task with ``loop=openai_chat_agent_loop``
(registered here as ``gsm8k_chat``: each turn is a chat call whose prompt is re-rendered from the
messages, as an OpenAI-compatible server does). Greedy, ``verify`` feedback, 3 turns x 128 tokens by
default. Per episode pair it compares the token ids (prompt, response, mask) and the reward, and
sums the chat loop's own measurement ``chat_rerender_turns`` (turns whose re-rendered prompt differed
from the trajectory's context; only turns after the first can differ).

    .venv/bin/python bench/chat_vs_token.py            # embedded SmolLM2, data/gsm8k/test.jsonl[:8]
    .venv/bin/python bench/chat_vs_token.py --model /path/to/hf_model --rows 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from pathlib import Path

CHAT_TASK = "gsm8k_chat"


def compare(token: list[dict], chat: list[dict]) -> dict:
    """Counts over episode pairs (same row): token-identical, equal rewards, re-rendered turns."""
    same = [t["prompt_ids"] == c["prompt_ids"] and t["response_ids"] == c["response_ids"]
            and t["response_mask"] == c["response_mask"] for t, c in zip(token, chat)]
    gaps = [abs(a - b) for t, c, ok in zip(token, chat, same) if ok
            for a, b in zip(t["response_logprobs"] or [], c["response_logprobs"] or []) if a is not None]
    return {
        "episodes": len(token),
        "token_identical": sum(same),
        "messages_equal": sum(t["messages"] == c["messages"] for t, c in zip(token, chat)),
        "rewards_equal": sum(t["reward"] == c["reward"] for t, c in zip(token, chat)),
        "rerendered_turns": int(sum(c["metrics"].get("chat_rerender_turns", 0) for c in chat)),
        "rerendered_tokens": int(sum(c["metrics"].get("chat_rerender_tokens", 0) for c in chat)),
        "later_turns": sum(max(c["num_turns"] - 1, 0) for c in chat),
        "errors": sum(x["error"] is not None for x in token + chat),
        "max_logprob_gap": max(gaps, default=0.0),
        "reward_token": sum(t["reward"] for t in token),
        "reward_chat": sum(c["reward"] for c in chat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="model.path: embedded (SmolLM2-135M-Instruct) or a HF folder")
    ap.add_argument("--data", default="data/gsm8k/test.jsonl")
    ap.add_argument("--rows", type=int, default=8, help="the first N rows")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="max new tokens per turn")
    ap.add_argument("--feedback", default="verify")
    args = ap.parse_args()
    print("$ " + shlex.join([".venv/bin/python", "bench/" + Path(__file__).name, *sys.argv[1:]]), flush=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    from omegaconf import OmegaConf

    import verl_agentic.tasks  # noqa: F401 - the built-in tasks
    from verl_agentic.tasks.data import load_rows
    from verl_agentic.main_rollout import load_config, make_backend, resolve_data_path, rollout_config
    from verl_agentic.rollout import AsyncRollout
    from verl_agentic.rollout.chat_loop import openai_chat_agent_loop
    from verl_agentic.tasks import TASKS, TaskSpec, get_task, register_task

    cfg = load_config([f"model.path={args.model}", f"data.path={args.data}", f"data.max_samples={args.rows}",
                       "rollout.temperature=0", f"rollout.max_turns={args.turns}",
                       f"rollout.max_new_tokens={args.tokens}", f"task.gsm8k.feedback={args.feedback}"])
    gsm8k = get_task("gsm8k")
    if CHAT_TASK not in TASKS:
        register_task(CHAT_TASK, TaskSpec(**{**gsm8k.__dict__, "loop": openai_chat_agent_loop}))
    task_cfg = OmegaConf.to_container(cfg.task.gsm8k, resolve=True)
    rows = load_rows(resolve_data_path(cfg.data.path), "gsm8k", cfg.data.max_samples)
    t0 = time.perf_counter()
    backend = make_backend(cfg)
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    walls, out = {}, {}
    try:
        for name in ("gsm8k", CHAT_TASK):
            rollout = AsyncRollout(backend, rollout_config(cfg), task_configs={name: task_cfg},
                                   default_task_type=name, seed=cfg.seed)
            t0 = time.perf_counter()
            out[name] = rollout.run_sync([{**r, "task_type": name} for r in rows])
            walls[name] = time.perf_counter() - t0
    finally:
        asyncio.run(backend.close())
    r = compare(out["gsm8k"], out[CHAT_TASK])

    print(f"\n{r['episodes']} rows of {args.data}, greedy, {args.feedback} feedback, {args.turns} turns x "
          f"{args.tokens} tokens; token loop {walls['gsm8k']:.1f} s, chat loop {walls[CHAT_TASK]:.1f} s")
    print("| episodes | token-identical | messages equal | rewards equal "
          "| re-rendered turns (of turns after the first) | re-rendered tokens | errors | reward token / chat | max logprob gap (identical) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {r['episodes']} | {r['token_identical']} | {r['messages_equal']} | {r['rewards_equal']} | "
          f"{r['rerendered_turns']} of {r['later_turns']} | {r['rerendered_tokens']} | {r['errors']} | "
          f"{r['reward_token']:g} / {r['reward_chat']:g} | {r['max_logprob_gap']:.1e} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
