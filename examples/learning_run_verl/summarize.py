"""Summarise the learning run through verl beside ours (examples/learning_run): metrics, table, curve.

    .venv/bin/python examples/learning_run_verl/summarize.py outputs/learning_run_verl/seed0 \
        --out examples/learning_run_verl

A verl run folder (``DEVICE=cpu scripts/run_gsm8k_multiturn.sh`` writes it: verl's ``metrics.jsonl``,
lines ``{"step": N, "data": {...}}``, and our trajectories ``rollouts/step_NNNNNN.jsonl``) becomes the
per-step rows of examples/learning_run under the same keys, so both runs are summarised by the same
code (``summarize_run`` of ``examples/learning_run/summarize.py``):

- ``reward/mean`` = verl's ``critic/score/mean`` (the reward of the step's episodes);
- ``accuracy/first_turn``, ``turns/mean``, ``turns/multi_turn_frac``, ``flips/wrong_to_right`` from the
  trajectories the step trained on (``rollouts/step_<N-1>.jsonl``: generated with the weights of update N-1);
- ``response_length/mean`` = verl's; ``timing/step_s`` = verl's ``timing_s/step``;
- ``actor/prob_diff_mean`` = verl's ``training/rollout_probs_diff_mean`` (|p_rollout - p_trainer| per token;
  our trainer logs a log-prob gap instead, so the two are not the same quantity).

Writes ``OUT/metrics/seed<N>.jsonl`` (these rows), ``OUT/metrics/seed<N>.verl.jsonl`` (verl's metrics as
logged), ``OUT/summary.json`` (verl's and ours, first-5 vs last-5 means, and where verl's step spends
its time: the mean of each ``timing_s/*``) and ``OUT/reward_curve.png`` (verl's seed over our three).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Optional

from verl_agentic.jsonl import read_json_lines

HERE = Path(__file__).resolve().parent
OURS = HERE.parent / "learning_run"
_spec = importlib.util.spec_from_file_location("learning_run_summarize", OURS / "summarize.py")
ours = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ours)


def verl_rows(run: Path) -> tuple[list[dict], list[dict]]:
    """(the rows under examples/learning_run's keys, verl's metrics as logged), one per training step."""
    logged = read_json_lines(run / "metrics.jsonl", what="a step's metrics")
    steps: dict[int, dict] = {}
    for line in logged:
        steps.setdefault(int(line["step"]), {}).update(line["data"])
    rows = []
    for step in sorted(s for s, m in steps.items() if "critic/score/mean" in m):
        m = steps[step]
        path = run / "rollouts" / f"step_{step - 1:06d}.jsonl"
        episodes = read_json_lines(path, what="an episode") if path.is_file() else []
        n = len(episodes) or 1
        metric = lambda k: sum(float((e.get("metrics") or {}).get(k, 0.0)) for e in episodes)  # noqa: E731
        rows.append({
            "step": step, "reward/mean": m["critic/score/mean"],
            "accuracy/first_turn": metric("first_correct") / n if episodes else None,
            "turns/mean": sum(e["num_turns"] for e in episodes) / n if episodes else None,
            "turns/multi_turn_frac": sum(e["num_turns"] >= 2 for e in episodes) / n if episodes else None,
            "flips/wrong_to_right": metric("flips_wrong_to_right") if episodes else None,
            "response_length/mean": m.get("response_length/mean"),
            "actor/prob_diff_mean": m.get("training/rollout_probs_diff_mean"),
            "timing/step_s": m.get("timing_s/step", 0.0), "episodes": len(episodes),
        })
    return rows, [{"step": s, **steps[s]} for s in sorted(steps)]


def timing(logged: list[dict]) -> dict[str, float]:
    keys = sorted({k for r in logged for k in r if k.startswith("timing_s/")})
    out = {}
    for k in keys:
        vals = [r[k] for r in logged if isinstance(r.get(k), (int, float)) and "critic/score/mean" in r]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out


def plot(verl: dict[str, list[dict]], mine: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for seed, rows in mine.items():
        ax.plot([r["step"] for r in rows], [r["reward/mean"] for r in rows], color="0.7", lw=1,
                label=f"main_ppo seed {seed}")
    for seed, rows in verl.items():
        s = ours.summarize_run(rows)["reward/mean"]
        ax.plot([r["step"] for r in rows], [r["reward/mean"] for r in rows], marker="o", ms=3, lw=2,
                label=f"verl main_ppo seed {seed}: {s['first']:.2f} -> {s['last']:.2f} ({s['delta']:+.2f})")
    ax.set_title("mean reward per step: verl's trainer on CPU vs verl_agentic.main_ppo")
    ax.set_xlabel("step")
    ax.set_ylabel("reward (0-1)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="verl run folders (OUT of the launch script), one per seed")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    (a.out / "metrics").mkdir(parents=True, exist_ok=True)
    verl, seeds = {}, {}
    for run in a.runs:
        if not (run / "metrics.jsonl").is_file():
            print(f"error: {run}: no metrics.jsonl (is this the OUT of DEVICE=cpu scripts/run_gsm8k_multiturn.sh?)",
                  file=sys.stderr)
            return 2
        seed = ours.seed_of(run)
        rows, logged = verl_rows(run)
        if len(rows) < 2:
            print(f"error: {run}: {len(rows)} training step(s); need at least 2", file=sys.stderr)
            return 2
        verl[seed] = rows
        (a.out / "metrics" / f"seed{seed}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (a.out / "metrics" / f"seed{seed}.verl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
        seeds[seed] = {**ours.summarize_run(rows), "timing_s_mean": timing(logged)}
    mine = {path.stem.removeprefix("seed"): read_json_lines(path, what="a step's metrics")
            for path in sorted((OURS / "metrics").glob("seed*.jsonl"))}
    summary = {"verl": seeds, "main_ppo": {s: ours.summarize_run(rows) for s, rows in mine.items()}}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(verl, mine, a.out / "reward_curve.png")
    print("| trainer | seed | steps | s/step | reward first-5 | last-5 | delta | turns first-5 -> last-5 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, group in (("verl", summary["verl"]), ("main_ppo", summary["main_ppo"])):
        for seed, s in group.items():
            r, t = s["reward/mean"], s["turns/mean"]
            print(f"| {name} | {seed} | {s['steps']} | {60 * s['train_minutes'] / s['steps']:.1f} | {r['first']:.3f} "
                  f"| {r['last']:.3f} | {r['delta']:+.3f} | {t['first']:.2f} -> {t['last']:.2f} |")
    for seed, s in seeds.items():
        print(f"verl seed {seed}, mean seconds per step: " +
              ", ".join(f"{k.removeprefix('timing_s/')} {v:.1f}" for k, v in s["timing_s_mean"].items()))
    print(f"wrote {a.out / 'summary.json'}, {a.out / 'reward_curve.png'}, {a.out / 'metrics'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
