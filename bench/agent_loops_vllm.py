"""Our ``task_agent`` against verl's own ``tool_agent`` (``ToolAgentLoop``), on the same vLLM rollout.

    .venv/bin/python bench/agent_loops_vllm.py series                  # seeds 0-2, both loops each, ABAB
    .venv/bin/python bench/agent_loops_vllm.py summarize --out bench/agent_loops/results
    .venv/bin/python bench/agent_loops_vllm.py series --seeds 0 --prompts 4 --steps 1 --allow-dirty   # a quick look

Real runs of verl's trainer (``DEVICE=cpu ROLLOUT=vllm scripts/run_gsm8k_multiturn.sh``: verl's vLLM rollout
on vLLM's CPU build, the embedded SmolLM2) on the same GSM8K test problems with the same tool, the same batch,
the same greedy sampling, and the same per-episode limits (3 assistant turns, ``--response-length`` tokens in
all), differing only in the agent loop:

- ``task_agent``: our gsm8k task with the ``calculator`` tool (hermes tool calls, no feedback);
- ``tool_agent``: verl's ``ToolAgentLoop`` with the same calculator as a verl function tool
  (``bench/agent_loops/verl_calculator.py``: our arithmetic, schema and replies), hermes format; a
  subclass that only records each episode in our trajectory schema, with each request's latency as verl's
  loop times it (``verl_tool_agent_dump.py``).

SmolLM2's chat template ignores ``tools=``; both runs use a copy of the model folder whose template
renders them as Qwen2.5's does (``bench/agent_loops/smollm2_tools.jinja``), so both loops show the
model the same prompt. **SmolLM2-135M calls no tool from a prompt**: greedy, on the first GSM8K test
problems, 0 of 12 answers called the calculator with no solved example, with one and with two
(``--shots``, ``few_shot()``: solved examples in which the assistant calls it), and 0 of 8 with the user
message also saying "First call the calculator tool." (2026-11-27). So the episodes are single-turn unless
``--model`` names a model that calls tools: ``bench/agent_loops/tool_sft.py`` makes one (a short fine-tune on
GSM8K train problems written as calculator episodes; greedy, 12 of 12 test problems then start with a call). A seed picks the
problems (``--prompts`` of GSM8K's test set); sampling is greedy, so the two loops' episodes of a seed can be
compared token for token.

``series`` runs, for each seed, both loops one after the other, the order alternating from seed to seed
(A B, B A, A B), into ``--work``; it refuses a checkout with uncommitted changes (``--allow-dirty`` marks the
results). ``summarize`` writes into ``--out`` each run's episodes in a few fields (``<loop>_seed<N>.episodes.jsonl``:
the problem, the assistant turns, the tool calls, each request's seconds, a hash of the generated tokens and one of the whole response),
verl's metrics and ``run.json``, then ``results.json`` and ``results.md``: per run and per loop (the mean over
seeds, 95% interval) the tool calls per episode, the per-request latency measured by the loops themselves
(p50, p90, mean), the episodes per second of verl's generation phase, the step time, our drift report on each
loop's episodes, and per seed how many episodes the two loops generated token for token alike (and how many whole
responses, the injected tool turns too, are alike). Given
``--out``'s own files it recomputes the same table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout
from verl_agentic.stats import mean_interval, quantile  # noqa: E402
HERE = REPO / "bench" / "agent_loops"
SCRIPT = REPO / "scripts" / "run_gsm8k_multiturn.sh"
LOOPS = ("task_agent", "tool_agent")
WORK = Path("/tmp/verl_agentic_agent_loops")


def calculator_episode(question: str, calls: list[tuple[str, str]], answer: str) -> list[dict]:
    """A solved GSM8K-style problem as messages: the user's question with the task's instruction, one
    assistant turn per ``(expression, value)`` calling the calculator and its reply, then ``answer``.
    The few-shot examples here and ``agent_loops/tool_sft.py``'s training episodes are both made by it."""
    from verl_agentic.tasks.gsm8k.texts import INSTRUCTION

    messages = [{"role": "user", "content": f"{question}\n{INSTRUCTION}"}]
    for expression, value in calls:
        call = {"type": "function", "function": {"name": "calculator",
                                                 "arguments": json.dumps({"expression": expression})}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": value}]
    return messages + [{"role": "assistant", "content": answer}]


def few_shot(shots: int) -> list[dict]:
    """``shots`` solved examples (0-2) in which the assistant calls the calculator, to put before a problem."""
    examples = [
        calculator_episode("A baker makes 12 loaves a day for 7 days. How many loaves does he make?",
                           [("12 * 7", "84")], "He makes 84 loaves.\n#### 84"),
        calculator_episode("Sara has 45 stickers and gives away 17. How many are left?",
                           [("45 - 17", "28")], "She has 28 stickers left.\n#### 28"),
    ]
    return [m for example in examples[:shots] for m in example]


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


def write_data(folder: Path, prompts: int, seed: int, shots: int) -> list[int]:
    """``prompts`` GSM8K test problems picked by ``seed``, each after ``shots`` solved examples; their indices."""
    import pandas as pd

    import verl_agentic.tasks  # noqa: F401  (the gsm8k preprocessor registers)
    from verl_agentic.agentic_utils import preprocess

    folder.mkdir(parents=True, exist_ok=True)
    preprocess("gsm8k", REPO / "data" / "gsm8k" / "test.jsonl", folder / "all.parquet")
    rows = pd.read_parquet(folder / "all.parquet")
    picked = sorted(random.Random(seed).sample(range(len(rows)), prompts))
    rows = rows.iloc[picked].copy()
    prefix = few_shot(shots)
    rows["prompt"] = [prefix + [dict(m) for m in p] for p in rows["prompt"]]
    rows.to_parquet(folder / "train.parquet")
    rows.iloc[:2].to_parquet(folder / "test.parquet")  # validation is off; verl still wants the file
    (folder / "all.parquet").unlink()
    return [int(r["index"]) for r in rows["extra_info"]]


def launch(loop: str, args: argparse.Namespace, model: Path, data: Path, out: Path, python: str) -> int:
    """One run of verl's trainer with the loop; its exit status (a failed run keeps its folder and log)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    common = [
        f"data.train_batch_size={args.prompts}", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.n=2",
        f"data.max_response_length={args.response_length}", f"agentic.max_new_tokens={args.response_length}",
        "data.max_prompt_length=768",  # the tool's description: about 380 tokens; with two solved examples 640
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
    (out / "launch.log").write_text(proc.stdout + proc.stderr)
    print(f"[bench] {loop}: exit {proc.returncode} after {wall:.0f} s; load average over the last 15 min "
          f"{os.getloadavg()[2]:.2f} (2 cores: above ~2.2 something else was running)", file=sys.stderr, flush=True)
    return proc.returncode


def completed(episode: dict, tokenizer) -> dict:
    """verl's ``ToolAgentLoop`` ends an episode at its turn or token limit before it appends the last
    assistant message to its messages (``_handle_generating_state``); the drift check needs one message
    per turn, so a missing one is filled in from its tokens (only the injected spans and the structure
    decide the check; generated tokens are compared with nothing)."""
    said = sum(m["role"] == "assistant" for m in episode["messages"][episode["num_prompt_messages"]:])
    turns = [t for t in episode["turns"] if t["role"] == "assistant"]
    if said >= len(turns):
        return episode
    messages = list(episode["messages"])
    for t in turns[said:]:
        ids = episode["response_ids"][t["start"]:t["end"]]
        messages.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
    return {**episode, "messages": messages}


def run_episodes(loop: str, out: Path) -> list[dict]:
    from verl_agentic.jsonl import read_json_lines

    if loop == "task_agent":
        return [e for f in sorted((out / "rollouts").glob("step_*.jsonl")) for e in read_json_lines(f)]
    return read_json_lines(out / "tool_agent.jsonl")


def compact(episode: dict) -> dict:
    """The fields of an episode the table reads (committed: the table can be recomputed from them)."""
    timing = episode.get("timing") or {}
    return {"index": int((episode.get("extra_info") or {}).get("index", episode.get("index", -1))),
            "assistant_turns": sum(t["role"] == "assistant" for t in episode["turns"]),
            "tool_calls": sum(t["role"] == "tool" for t in episode["turns"]),
            "generated": sum(episode["response_mask"]), "requests_s": timing.get("requests_s") or [],
            # the generated tokens (mask 1) and, apart, the whole response (the injected turns too)
            "generated_sha1": _sha1([t for t, m in zip(episode["response_ids"], episode["response_mask"]) if m]),
            "tokens_sha1": _sha1(episode["response_ids"])}


def _sha1(ids: list[int]) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:16]


def summarize_run(loop: str, episodes: list[dict], metrics_rows: list[dict], drift: dict | None, info: dict) -> dict:
    steps: dict[int, dict] = {}
    for row in metrics_rows:
        steps.setdefault(row["step"], {}).update(row["data"])
    steps = {s: m for s, m in steps.items() if "timing_s/gen" in m}
    requests = [x for e in episodes for x in e["requests_s"]]
    gen_s = sum(m["timing_s/gen"] for m in steps.values())
    r3 = lambda x: None if x is None else round(x, 4)  # noqa: E731
    return {"loop": loop, "seed": info.get("seed"), "exit": info.get("exit"), "commit": info.get("commit"),
            "steps": len(steps), "episodes": len(episodes),
            "tool_calls_per_episode": round(sum(e["tool_calls"] for e in episodes) / max(1, len(episodes)), 3),
            "episodes_with_tool_calls": sum(e["tool_calls"] > 0 for e in episodes),
            "requests": len(requests), "request_s_p50": r3(quantile(requests, 0.5)),
            "request_s_p90": r3(quantile(requests, 0.9)),
            "request_s_mean": r3(statistics.mean(requests)) if requests else None,
            "episodes_per_s": round(len(episodes) / gen_s, 3) if gen_s else None,
            "step_s": round(statistics.mean(m["timing_s/step"] for m in steps.values()), 1) if steps else None,
            "drift_episodes_ok": None if drift is None else drift["episodes_ok"],
            "drift_injected_differing_tokens": None if drift is None else drift["injected_differing_tokens"]}


def interval(values: list[float]) -> list[float | None]:
    """``[mean, low, high]`` (95%, ``verl_agentic.stats``; no interval under 2 values)."""
    return list(mean_interval(values, digits=4))


def identical(a: list[dict], b: list[dict], key: str = "generated_sha1") -> int:
    """Episodes of ``a`` whose generated tokens (``key="tokens_sha1"``: whole response, injected turns
    too) ``b`` also has for the same problem."""
    seen: dict[int, list[str]] = {}
    for e in b:
        seen.setdefault(e["index"], []).append(e.get(key))
    return sum(1 for e in a if e.get(key) is not None and e[key] in seen.get(e["index"], []))


LOOP_KEYS = ("tool_calls_per_episode", "request_s_p50", "request_s_p90", "request_s_mean", "episodes_per_s", "step_s")


def summarize(runs: dict[tuple[str, int], dict], out: Path) -> dict:
    """``runs``: ``(loop, seed) -> {"episodes", "metrics", "drift", "info"}``; writes results.json / .md."""
    rows = [summarize_run(loop, r["episodes"], r["metrics"], r["drift"], r["info"]) for (loop, _), r in sorted(runs.items())]
    seeds = sorted({seed for _, seed in runs})
    pairs = [{"seed": s, "episodes": len(runs[("task_agent", s)]["episodes"]),
              "identical": identical(runs[("task_agent", s)]["episodes"], runs[("tool_agent", s)]["episodes"]),
              "identical_response": identical(runs[("task_agent", s)]["episodes"], runs[("tool_agent", s)]["episodes"],
                                              "tokens_sha1")}
             for s in seeds if ("task_agent", s) in runs and ("tool_agent", s) in runs]
    loops = []
    for loop in LOOPS:
        done = [r for r in rows if r["loop"] == loop and r["exit"] == 0]
        loops.append({"loop": loop, "runs": sum(r["loop"] == loop for r in rows), "complete": len(done),
                      **{k: interval([r[k] for r in done if r[k] is not None]) for k in LOOP_KEYS}})
    by = {(r["loop"], r["seed"]): r for r in rows if r["exit"] == 0}
    ratio = {k: interval([by[("task_agent", s)][k] / by[("tool_agent", s)][k] for s in seeds
                          if ("task_agent", s) in by and ("tool_agent", s) in by and by[("tool_agent", s)][k]])
             for k in ("request_s_p50", "request_s_mean", "episodes_per_s", "step_s")}
    result = {"commits": sorted({r["commit"] for r in rows if r["commit"]}), "runs": rows, "loops": loops,
              "task_agent_over_tool_agent": ratio, "identical": pairs}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    cell = lambda v: "-" if v is None else (f"{v[0]}" if v[1] is None else f"{v[0]} [{v[1]}, {v[2]}]") \
        if isinstance(v, list) else str(v)  # noqa: E731
    run_cols = ("loop", "seed", "exit", "steps", "episodes", "tool_calls_per_episode", "episodes_with_tool_calls",
                "requests", "request_s_p50", "request_s_p90", "request_s_mean", "episodes_per_s", "step_s",
                "drift_episodes_ok")
    lines = [f"Commit {', '.join(c[:7] for c in result['commits']) or '?'}; per loop: the mean over seeds "
             "[95% interval, Student's t].", "", "| " + " | ".join(run_cols) + " |", "|" + " --- |" * len(run_cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in run_cols) + " |" for r in rows]
    loop_cols = ("loop", "runs", "complete", *LOOP_KEYS)
    lines += ["", "| " + " | ".join(loop_cols) + " |", "|" + " --- |" * len(loop_cols)]
    lines += ["| " + " | ".join(cell(l[c]) for c in loop_cols) + " |" for l in loops]  # noqa: E741
    lines += ["", "task_agent / tool_agent, per seed then the mean [95% interval]: " +
              "; ".join(f"{k} {cell(v)}" for k, v in ratio.items()),
              "episodes whose generated tokens are identical (task_agent's found among tool_agent's, same "
              "problem; in brackets: the whole response, injected turns too, identical): " +
              ", ".join(f"seed {p['seed']}: {p['identical']} of {p['episodes']} ({p['identical_response']})"
                        for p in pairs)]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def series(args: argparse.Namespace) -> int:
    from verl_agentic.models.embedded import embedded_model_dir
    from verl_agentic.provenance import DirtyTree, source_state

    try:
        state = source_state(args.allow_dirty)
    except DirtyTree as e:
        sys.exit(f"agent_loops_vllm.py: {e}")
    python = subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm.sh")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    model = bench_model(args.model or embedded_model_dir(quiet=True), args.work / "model")
    failed = 0
    for i, seed in enumerate(args.seeds):
        data = args.work / f"data_seed{seed}"
        indices = write_data(data, args.prompts, seed, args.shots)
        for loop in LOOPS if i % 2 == 0 else LOOPS[::-1]:
            out = args.work / f"{loop}_seed{seed}"
            print(f"[bench] {loop} seed {seed}: verl's trainer, vLLM rollout, {args.prompts} prompts x 2, "
                  f"{args.steps} steps ...", file=sys.stderr, flush=True)
            start = time.time()
            code = launch(loop, args, model, data, out, python)
            (out / "run.json").write_text(json.dumps({
                "loop": loop, "seed": seed, "problems": indices, **state, "exit": code,
                "wall_s": round(time.time() - start, 1), "load_15min": round(os.getloadavg()[2], 2),
                "args": {k: str(v) for k, v in vars(args).items() if k != "func"}}, indent=1))
            failed += code != 0
    return 1 if failed else 0


def collect(args: argparse.Namespace) -> int:
    """Summarize ``--work``'s runs into ``--out`` (copying the small files), or ``--out``'s own files again."""
    from transformers import AutoTokenizer

    from verl_agentic.jsonl import read_json_lines
    from verl_agentic.rollout.trajectory import drift_summary

    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, int], dict] = {}
    folders = sorted(p for p in args.work.glob("*_seed*") if p.is_dir() and p.name.split("_seed")[0] in LOOPS)
    if folders:
        tokenizer = AutoTokenizer.from_pretrained(args.work / "model")
        for folder in folders:
            loop, seed = folder.name.rsplit("_seed", 1)
            info = json.loads((folder / "run.json").read_text())
            full = run_episodes(loop, folder) if info["exit"] == 0 else []
            full = [completed(e, tokenizer) for e in full] if loop == "tool_agent" else full
            drift = drift_summary(full, tokenizer, stop_token_ids=[tokenizer.eos_token_id]) if full else None
            info["drift"] = None if drift is None else {k: drift[k] for k in ("episodes_ok", "injected_differing_tokens")}
            episodes = [compact(e) for e in full]
            metrics = read_json_lines(folder / "metrics.jsonl") if (folder / "metrics.jsonl").is_file() else []
            (args.out / f"{folder.name}.episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
            (args.out / f"{folder.name}.metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
            (args.out / f"{folder.name}.run.json").write_text(json.dumps(info, indent=1))
    for f in sorted(args.out.glob("*_seed*.run.json")):
        name = f.name.removesuffix(".run.json")
        loop, seed = name.rsplit("_seed", 1)
        info = json.loads(f.read_text())
        runs[(loop, int(seed))] = {"episodes": read_json_lines(args.out / f"{name}.episodes.jsonl"),
                                   "metrics": read_json_lines(args.out / f"{name}.metrics.jsonl"),
                                   "drift": info.get("drift"), "info": info}
    if not runs:
        sys.exit(f"agent_loops_vllm.py: no runs in {args.work} or {args.out}")
    summarize(runs, args.out)
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("series")
    s.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[0, 1, 2])
    s.add_argument("--prompts", type=int, default=8, help="GSM8K problems per step (x 2 episodes)")
    s.add_argument("--steps", type=int, default=2)
    s.add_argument("--shots", type=int, default=0, choices=(0, 1, 2), help="solved examples before each problem")
    s.add_argument("--model", type=Path, default=None, help="a model folder (default: the embedded SmolLM2)")
    s.add_argument("--response-length", type=int, default=256, help="tokens of all turns of an episode")
    s.add_argument("--work", type=Path, default=WORK)
    s.add_argument("--allow-dirty", action="store_true")
    m = sub.add_parser("summarize")
    m.add_argument("--work", type=Path, default=WORK)
    m.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    sys.exit(series(args) if args.command == "series" else collect(args))


if __name__ == "__main__":
    main()
