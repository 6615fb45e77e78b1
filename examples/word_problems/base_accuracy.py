"""The base model's accuracy on the held-out word problems, per difficulty: greedy and at temperature 1.

    .venv/bin/python examples/word_problems/base_accuracy.py [--model embedded] [--samples 4]

Runs ``python -m verl_agentic.main_rollout`` on ``heldout.jsonl`` with the settings a training run would
use (gsm8k task, ``retry`` feedback, 2 assistant turns of at most 24 tokens), once greedy (one episode a
problem) and once at temperature 1 (``--samples`` episodes a problem, seed 0). Writes
``base_episodes.jsonl`` (one line per episode: mode, problem index, ops, first/final correct, flips,
answered) and ``base_accuracy.json`` (the rates of :func:`verl_agentic.trainer.metrics.validation_metrics`,
overall and per number of operations), and prints the table. ``tests/test_word_problems.py``
recomputes the json from the episodes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parent.parent
RETRY = "That is not right. Try again. Answer with the number only."
SETTINGS = ["task_type=gsm8k", "task.gsm8k.feedback=retry", "task.gsm8k.extraction=flexible",
            f"task.gsm8k.retry_message='{RETRY}'", "rollout.max_turns=2", "rollout.max_new_tokens=24",
            "rollout.max_total_tokens=512", "reward.manager=naive", "data.max_samples=-1"]
KEYS = ("first_correct", "final_correct", "flips_wrong_to_right", "flips_right_to_wrong", "answered")


def table(episodes: list[dict]) -> dict:
    """{mode: {"all" | "ops=1" | ...: validation metrics}} from the per-episode lines."""
    from verl_agentic.trainer.metrics import validation_metrics

    out: dict = {}
    for mode in sorted({e["mode"] for e in episodes}):
        eps = [e for e in episodes if e["mode"] == mode]
        groups = {"all": eps, **{f"ops={k}": [e for e in eps if e["ops"] == k] for k in sorted({e["ops"] for e in eps})}}
        out[mode] = {}
        for name, group in groups.items():
            trajs = [{"task_type": "gsm8k", "metrics": {k: e[k] for k in KEYS}} for e in group]
            out[mode][name] = validation_metrics(trajs, [e["final_correct"] for e in group])
    return out


def run(model: str, mode: str, samples: int, work: Path) -> list[dict]:
    extra = (["rollout.temperature=0", "rollout.n=1"] if mode == "greedy"
             else ["rollout.temperature=1.0", f"rollout.n={samples}", "seed=0"])
    out = work / mode
    subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", f"model.path={model}",
                    f"data.path={HERE / 'heldout.jsonl'}", *SETTINGS, *extra, f"output.dir={out}",
                    "output.quiet=true"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    episodes = []
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        m = t["metrics"]
        episodes.append({"mode": mode, "index": t["index"], "sample": t["sample_id"], "ops": t["extra_info"]["ops"],
                         **{k: float(m[k]) for k in KEYS}})
    return episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="word-problems-base-"))
    episodes = run(args.model, "greedy", 1, work) + run(args.model, "temperature_1", args.samples, work)
    episodes.sort(key=lambda e: (e["mode"], e["index"], e["sample"]))
    (HERE / "base_episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    result = table(episodes)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    (HERE / "base_accuracy.json").write_text(json.dumps({"model": args.model, "commit": commit, "settings": SETTINGS,
                                                        "samples_at_t1": args.samples, "table": result}, indent=1) + "\n")
    print(f"model {args.model}, held-out word problems, retry feedback, 2 turns x 24 tokens (commit {commit})")
    print("| mode | ops | episodes | first-turn acc | final acc | wrong->right | right->wrong | answered |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, groups in result.items():
        for name, m in groups.items():
            print(f"| {mode} | {name} | {m['episodes']:.0f} | {m['accuracy/first_turn']:.3f} | {m['accuracy/final']:.3f} | "
                  f"{m['flip_rate/wrong_to_right']:.3f} | {m['flip_rate/right_to_wrong']:.3f} | {m['answered']:.3f} |")


if __name__ == "__main__":
    main()
