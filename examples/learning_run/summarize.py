"""Summarise learning runs (one per seed) into the committed evidence: metrics, summary and curve.

    python examples/learning_run/summarize.py outputs/learning_run/seed0 outputs/learning_run/seed1 \
        outputs/learning_run/seed2 --out examples/learning_run

For every run folder (as ``main_ppo`` writes it: ``metrics.jsonl``, ``config.yaml``) this writes
``OUT/metrics/seed<N>.jsonl`` (the per-step metrics, unchanged), and once for all runs
``OUT/summary.json`` (first-5-step and last-5-step means per seed, their difference, training
minutes) and ``OUT/reward_curve.png``. Exit status 0 when every seed meets the criterion
(last-5 minus first-5 mean reward >= --min-delta within --max-minutes of training steps), else 1;
2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Optional

from verl_agentic.jsonl import read_json_lines
from verl_agentic.interfaces import ConfigError

# Keys summarised per seed: the reward and what shows the multi-turn path at work.
KEYS = (
    "reward/mean",
    "accuracy/first_turn",
    "turns/mean",
    "turns/multi_turn_frac",
    "flips/wrong_to_right",
    "response_length/mean",
    "actor/logprob_gap_mean",
)


class InputError(Exception):
    pass


def read_metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise InputError(f"{run}: no metrics.jsonl (is this a main_ppo output.dir?)")
    try:
        rows = read_json_lines(path, what="a step's metrics")
    except ConfigError as e:
        raise InputError(str(e)) from None
    for i, row in enumerate(rows, 1):
        if not isinstance(row.get("reward/mean"), (int, float)):
            raise InputError(f"{path}:{i}: no numeric 'reward/mean'")
    if len(rows) < 2:
        raise InputError(f"{path}: {len(rows)} step(s); need at least 2 to compare first and last steps")
    return rows


def seed_of(run: Path) -> str:
    cfg = run / "config.yaml"
    if cfg.is_file():
        m = re.search(r"^seed:\s*(\S+)\s*$", cfg.read_text(), re.MULTILINE)
        if m:
            return m.group(1)
    m = re.search(r"(\d+)$", run.name)
    return m.group(1) if m else run.name


def _mean(rows: list[dict], key: str) -> Optional[float]:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def summarize_run(rows: list[dict], window: int = 5) -> dict:
    k = min(window, len(rows) // 2)
    first, last = rows[:k], rows[-k:]
    out: dict = {"steps": len(rows), "window": k,
                 "train_minutes": sum(r.get("timing/step_s", 0.0) for r in rows) / 60.0}
    for key in KEYS:
        a, b = _mean(first, key), _mean(last, key)
        out[key] = {"first": a, "last": b, "delta": (b - a) if a is not None and b is not None else None}
    return out


def plot(runs: dict[str, list[dict]], path: Path, min_delta: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for seed, rows in runs.items():
        steps = [r.get("step", i + 1) for i, r in enumerate(rows)]
        s = summarize_run(rows)["reward/mean"]
        ax1.plot(steps, [r["reward/mean"] for r in rows], marker="o", ms=3,
                 label=f"seed {seed}: {s['first']:.2f} -> {s['last']:.2f} ({s['delta']:+.2f})")
        ax2.plot(steps, [r.get("turns/mean") for r in rows], marker="o", ms=3, label=f"seed {seed}")
    ax1.set_title(f"mean reward per step (first-5 vs last-5 mean; target delta >= {min_delta})")
    ax1.set_xlabel("step")
    ax1.set_ylabel("reward (0-1)")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(fontsize=8)
    ax2.set_title("turns per episode (2 = retry feedback used)")
    ax2.set_xlabel("step")
    ax2.set_ylim(0.95, 2.05)
    ax2.legend(fontsize=8)
    fig.suptitle("GRPO, SmolLM2-135M-Instruct, 2-core CPU: easy word problems with retry feedback")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="main_ppo output folders, one per seed")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--min-delta", type=float, default=0.2)
    p.add_argument("--max-minutes", type=float, default=20.0)
    a = p.parse_args(argv)
    try:
        runs: dict[str, list[dict]] = {}
        for run in a.runs:
            seed = seed_of(run)
            if seed in runs:
                raise InputError(f"{run}: seed {seed} given twice")
            runs[seed] = read_metrics(run)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    (a.out / "metrics").mkdir(parents=True, exist_ok=True)
    seeds = {}
    for seed, rows in runs.items():
        (a.out / "metrics" / f"seed{seed}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        s = summarize_run(rows)
        s["passed"] = s["reward/mean"]["delta"] >= a.min_delta and s["train_minutes"] <= a.max_minutes
        seeds[seed] = s
    summary = {"criterion": {"min_reward_delta": a.min_delta, "max_train_minutes": a.max_minutes},
               "all_passed": all(s["passed"] for s in seeds.values()), "seeds": seeds}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(runs, a.out / "reward_curve.png", a.min_delta)
    print("| seed | steps | train min | reward first-5 | last-5 | delta | turns first-5 -> last-5 | passed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for seed, s in seeds.items():
        r, t = s["reward/mean"], s["turns/mean"]
        print(f"| {seed} | {s['steps']} | {s['train_minutes']:.1f} | {r['first']:.3f} | {r['last']:.3f} "
              f"| {r['delta']:+.3f} | {t['first']:.2f} -> {t['last']:.2f} | {'yes' if s['passed'] else 'NO'} |")
    print(f"wrote {a.out / 'summary.json'}, {a.out / 'reward_curve.png'}, {a.out / 'metrics'}/")
    return 0 if summary["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
