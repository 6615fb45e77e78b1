"""Our ``task_agent`` against verl's own ``tool_agent`` (``ToolAgentLoop``), on the same vLLM rollout.

    .venv/bin/python bench/agent_loops_vllm.py                     # 8 prompts x 2 episodes, 2 steps each
    .venv/bin/python bench/agent_loops_vllm.py --prompts 16 --steps 3 --work /tmp/loops

Two real runs of verl's trainer (``DEVICE=cpu ROLLOUT=vllm scripts/run_gsm8k_multiturn.sh``: verl's
vLLM rollout on vLLM's CPU build, the embedded SmolLM2) on the same GSM8K test problems with the same
tool, the same batch, the same greedy sampling, and the same per-episode limits (3 assistant turns,
``--response-length`` tokens in all), differing only in the agent loop:

- ``task_agent``: our gsm8k task with the ``calculator`` tool (hermes tool calls, no feedback);
- ``tool_agent``: verl's ``ToolAgentLoop`` with the same calculator as a verl function tool
  (``bench/agent_loops/verl_calculator.py``: our arithmetic, schema and replies), hermes format; a
  subclass that only records each episode in our trajectory schema (``verl_tool_agent_dump.py``).

SmolLM2's chat template ignores ``tools=``; both runs use a copy of the model folder whose template
renders them as Qwen2.5's does (``bench/agent_loops/smollm2_tools.jinja``), so both loops show the
model the same prompt. Per loop, over all steps: episodes/s and generated tokens/s of the rollout
phase (verl's ``timing_s/gen``), the mean step time, tool calls, and our drift report on each loop's
episodes (``verl_agentic.rollout.drift_summary``: every injected span against the chat template,
the mask, the logprobs); and how many episodes the two loops generated token for token alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "bench" / "agent_loops"
SCRIPT = REPO / "scripts" / "run_gsm8k_multiturn.sh"
LOOPS = ("task_agent", "tool_agent")


def bench_model(src: Path, dst: Path) -> Path:
    """The model folder with the tool-rendering template (weights linked, not copied)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        target = dst / f.name
        if target.exists() or target.is_symlink():
            target.unlink()
        if f.suffix == ".safetensors":
            target.symlink_to(f)
        else:
            shutil.copy(f, target)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config["chat_template"] = (HERE / "smollm2_tools.jinja").read_text()
    (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    return dst


def write_data(folder: Path, prompts: int) -> None:
    import pandas as pd

    import verl_agentic.tasks  # noqa: F401  (the gsm8k preprocessor registers)
    from verl_agentic.agentic_utils import preprocess

    folder.mkdir(parents=True, exist_ok=True)
    preprocess("gsm8k", REPO / "data" / "gsm8k" / "test.jsonl", folder / "train.parquet", max_samples=prompts)
    rows = pd.read_parquet(folder / "train.parquet")
    rows.iloc[:2].to_parquet(folder / "test.parquet")  # validation is off; verl still wants the file


def launch(loop: str, args: argparse.Namespace, model: Path, data: Path, out: Path, python: str) -> float:
    out.mkdir(parents=True, exist_ok=True)
    common = [
        f"data.train_batch_size={args.prompts}", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.n=2",
        f"data.max_response_length={args.response_length}", f"agentic.max_new_tokens={args.response_length}",
        "data.max_prompt_length=512",  # the prompts with the tool's description reach 425 tokens
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        # smaller micro-batches than the script's: 256-token responses over a 49k vocabulary grow the
        # FSDP worker past 13 GB otherwise (the machine has 24)
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    ]
    env = {**os.environ, "DEVICE": "cpu", "ROLLOUT": "vllm", "OUT": str(out), "DATA_DIR": str(data),
           "MODEL_PATH": str(model), "PYTHON": python, "PYTHONUNBUFFERED": "1"}
    if loop == "task_agent":
        extra = ["actor_rollout_ref.rollout.agent.default_agent_loop=task_agent",
                 "+agentic.task.gsm8k.tools=[calculator]", "agentic.task.gsm8k.feedback=none"]
    else:
        extra = ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent_dump",
                 f"actor_rollout_ref.rollout.multi_turn.function_tool_path={HERE / 'verl_calculator.py'}"]
        env.update(VERL_USE_EXTERNAL_MODULES="verl_tool_agent_dump", BENCH_DUMP=str(out / "tool_agent.jsonl"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), *common, *extra], capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    load = os.getloadavg()[2]
    print(f"[bench] {loop}: {wall:.0f} s, load average over the last 15 min {load:.2f} "
          f"(2 cores: above ~2.2 something else was running)", file=sys.stderr, flush=True)
    (out / "run.json").write_text(json.dumps({"wall_s": round(wall, 1), "load_15min": round(load, 2)}))
    (out / "launch.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"{loop}: the run failed (exit {proc.returncode}); log {out / 'launch.log'}:\n"
                 f"{(proc.stdout + proc.stderr)[-3000:]}")
    return wall


def completed(episode: dict, tokenizer) -> dict:
    """verl's ``ToolAgentLoop`` ends an episode at its turn or token limit before it appends the last
    assistant message to its messages (``_handle_generating_state``); the drift check needs one message
    per turn, so a missing one is filled in from its tokens (only the injected spans and the structure
    decide the check; generated tokens are compared with nothing)."""
    said = sum(m["role"] == "assistant" for m in episode["messages"])
    turns = [t for t in episode["turns"] if t["role"] == "assistant"]
    if said >= len(turns):
        return episode
    messages = list(episode["messages"])
    for t in turns[said:]:
        ids = episode["response_ids"][t["start"]:t["end"]]
        messages.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
    return {**episode, "messages": messages}


def summarize(loop: str, out: Path, wall: float, tokenizer, stop_ids: list[int]) -> dict:
    from verl_agentic.jsonl import read_json_lines
    from verl_agentic.rollout.trajectory import drift_summary

    steps = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update(row["data"])
    steps = {s: m for s, m in steps.items() if "timing_s/gen" in m}
    if loop == "task_agent":
        episodes = [e for f in sorted((out / "rollouts").glob("step_*.jsonl")) for e in read_json_lines(f)]
    else:
        episodes = [completed(e, tokenizer) for e in read_json_lines(out / "tool_agent.jsonl")]
    gen_s = sum(m["timing_s/gen"] for m in steps.values())
    tokens = sum(sum(e["response_mask"]) for e in episodes)
    drift = drift_summary(episodes, tokenizer, stop_token_ids=stop_ids)
    return {"loop": loop, "steps": len(steps), "episodes": len(episodes), "gen_s": round(gen_s, 2),
            "episodes_per_s": round(len(episodes) / gen_s, 3), "tokens_per_s": round(tokens / gen_s, 1),
            "generated_tokens": tokens, "step_s": round(sum(m["timing_s/step"] for m in steps.values()) / len(steps), 1),
            "run_wall_s": round(wall, 1),
            "tool_calls": sum(1 for e in episodes for t in e["turns"] if t["role"] == "tool"),
            "multi_turn_episodes": sum(1 for e in episodes if sum(t["role"] == "assistant" for t in e["turns"]) > 1),
            "drift_episodes_ok": drift["episodes_ok"], "drift_injected_differing_tokens": drift["injected_differing_tokens"],
            "drift_examples": drift["examples"][:1], "_episodes": episodes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=8, help="GSM8K problems per step (x 2 episodes)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--response-length", type=int, default=256, help="tokens of all turns of an episode")
    p.add_argument("--work", type=Path, default=Path("/tmp/verl_agentic_agent_loops"))
    p.add_argument("--reuse", action="store_true", help="summarize the runs already in --work (no new runs)")
    args = p.parse_args()
    from transformers import AutoTokenizer

    from verl_agentic.models.embedded import embedded_model_dir

    python = subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm.sh")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    if not args.reuse:
        shutil.rmtree(args.work, ignore_errors=True)
    model = bench_model(embedded_model_dir(quiet=True), args.work / "model")
    if not args.reuse:
        write_data(args.work / "data", args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(model)
    stop_ids = [tokenizer.eos_token_id]
    results = {}
    for loop in LOOPS:
        print(f"[bench] {loop}: verl's trainer, vLLM rollout, {args.prompts} prompts x 2, {args.steps} steps ...",
              file=sys.stderr, flush=True)
        if args.reuse:
            wall = json.loads((args.work / loop / "run.json").read_text())["wall_s"]
        else:
            wall = launch(loop, args, model, args.work / "data", args.work / loop, python)
        results[loop] = summarize(loop, args.work / loop, wall, tokenizer, stop_ids)
    ours, theirs = (results[k].pop("_episodes") for k in LOOPS)
    by_key = {}
    for e in theirs:
        by_key.setdefault(e["index"], []).append(e["response_ids"])
    same = sum(1 for e in ours if e["response_ids"] in by_key.get(e["extra_info"].get("index"), []))
    print(f"verl's trainer with verl's vLLM rollout on CPU (float32), SmolLM2-135M, {args.prompts} GSM8K test "
          f"problems x 2 episodes a step, {args.steps} steps, greedy, calculator tool, <= 3 assistant turns, "
          f"{args.response_length} response tokens")
    cols = ("episodes", "episodes_per_s", "tokens_per_s", "step_s", "tool_calls", "multi_turn_episodes",
            "drift_episodes_ok")
    print("| loop | " + " | ".join(cols) + " |")
    print("| --- " * (len(cols) + 1) + "|")
    for loop in LOOPS:
        print(f"| {loop} | " + " | ".join(str(results[loop][c]) for c in cols) + " |")
    a, b = results["task_agent"], results["tool_agent"]
    print(f"task_agent / tool_agent: episodes/s {a['episodes_per_s'] / b['episodes_per_s']:.2f}x, "
          f"tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x, step time {a['step_s'] / b['step_s']:.2f}x; "
          f"token-identical episodes: {same} of {len(ours)}")
    (args.work / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "results": results, "identical_episodes": same}, indent=1))
    print(f"details: {args.work / 'results.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
