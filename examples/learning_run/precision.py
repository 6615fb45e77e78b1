"""The learning run with a low-precision rollout: fp32 vs bf16 without and with rollout correction (issue 31).

    .venv/bin/python examples/learning_run/precision.py run [--seed 0] [--arms fp32,bf16,bf16_tis]   # ~10 min an arm
    .venv/bin/python examples/learning_run/precision.py summarize --out examples/learning_run/precision

`examples/learning_run/run.sh SEED` (GRPO on easy word problems, 20 steps, the embedded SmolLM2) once per
arm, the same seed, one after another, plus greedy validation on 100 held-out problems
(``heldout.jsonl``: ``make_data.py --seed 1``, questions of the training file removed) before the first
step and every 10 steps:

- ``fp32``: today's run (rollout and trainer in fp32; old logprobs are the rollout's, the gap ~3e-6);
- ``bf16``: the rollout generates with bf16 weights (``rollout.hf.weight_dtype=bfloat16``), the trainer
  in fp32 recomputes the old logprobs and ignores the mismatch (what verl's trainer does by default);
- ``bf16_tis``: the same with verl's token-level truncated importance sampling
  (``algorithm.rollout_correction.rollout_is=token``, threshold 2).

``summarize`` writes OUT/precision.json, OUT/precision.md and OUT/metrics/<arm>.jsonl (each run's
per-step metrics, unchanged): the reward of the first and last 5 steps, held-out accuracy before and
after, the rollout-vs-trainer logprob gap, the rollout's generated tokens per second, the correction's
own metrics and the wall clock of the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from verl_agentic.jsonl import read_json_lines

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
HELDOUT = HERE / "heldout.jsonl"
COMMON = [f"data.val_path={HELDOUT}", "trainer.test_freq=10"]
ARMS = {
    "fp32": [],
    "bf16": ["rollout.hf.weight_dtype=bfloat16", "actor.recompute_old_logprobs=true"],
    "bf16_tis": ["rollout.hf.weight_dtype=bfloat16", "algorithm.rollout_correction.rollout_is=token",
                 "algorithm.rollout_correction.rollout_is_threshold=2.0"],
}
OUTPUTS = REPO / "outputs" / "learning_run_precision"


def write_heldout(n: int = 100) -> None:
    """100 problems of another seed whose questions the training file does not have."""
    if HELDOUT.is_file():
        return
    tmp = HERE / "heldout.tmp.jsonl"
    subprocess.run([sys.executable, str(HERE / "make_data.py"), "--seed", "1", "--n", str(4 * n), "--out", str(tmp)],
                   check=True, stdout=subprocess.DEVNULL)
    train = {r["prompt"][0]["content"] for r in read_json_lines(HERE / "easy_arith.jsonl")}
    rows = [r for r in read_json_lines(tmp) if r["prompt"][0]["content"] not in train][:n]
    tmp.unlink()
    HELDOUT.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run(seed: int, arms: list[str]) -> None:
    write_heldout()
    for arm in arms:
        out = OUTPUTS / arm
        shutil.rmtree(out, ignore_errors=True)
        print(f"== {arm}: {' '.join(ARMS[arm]) or '(run.sh as it is)'}", flush=True)
        subprocess.run(["bash", str(HERE / "run.sh"), str(seed), *COMMON, *ARMS[arm], f"output.dir={out}"],
                       check=True, env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)})


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def summarize(out: Path, arms: list[str], runs: Path = OUTPUTS) -> dict:
    """Write OUT/precision.json, OUT/precision.md and OUT/metrics/<arm>.jsonl from ``runs/<arm>/metrics.jsonl``."""
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    result = {}
    for arm in arms:
        src = runs / arm / "metrics.jsonl"
        shutil.copyfile(src, out / "metrics" / f"{arm}.jsonl")
        rows = read_json_lines(src)
        steps = [r for r in rows if r.get("step", 0) >= 1 and "reward/mean" in r]
        vals = [r for r in rows if "val/accuracy/final" in r]
        gen_s = sum(r.get("timing/rollout_s", 0) for r in steps)
        result[arm] = {
            "overrides": ARMS[arm],
            "steps": len(steps),
            "reward_first5": _mean(steps[:5], "reward/mean"),
            "reward_last5": _mean(steps[-5:], "reward/mean"),
            "heldout_before": vals[0]["val/accuracy/final"] if vals else None,
            "heldout_after": vals[-1]["val/accuracy/final"] if len(vals) > 1 else None,
            "heldout_curve": [(r["step"], r["val/accuracy/final"]) for r in vals],
            "logprob_gap_mean": _mean(steps, "actor/logprob_gap_mean"),
            "logprob_gap_max": max((r.get("actor/logprob_gap_max") or 0) for r in steps) if steps else None,
            "rollout_tok_s": sum(r.get("perf/generated_tokens", 0) for r in steps) / gen_s if gen_s else None,
            "rollout_s": gen_s,
            "step_minutes": sum(r.get("timing/step_s", 0) for r in steps) / 60,
            "rollout_corr": {k: _mean(steps, k) for k in sorted({k for r in steps for k in r})
                             if k.startswith("rollout_corr/") and any(s in k for s in
                                                                      ("is_mean", "is_max", "clip", "kl", "veto", "rs_"))},
            "reward_curve": [r["reward/mean"] for r in steps],
        }
    (out / "precision.json").write_text(json.dumps(result, indent=1))
    lines = ["| arm | overrides | reward, steps 1-5 | steps 16-20 | held-out before -> after | logprob gap (mean / max) | "
             "rollout tok/s | steps (min) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, r in result.items():
        fmt = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
        lines.append(f"| {arm} | {' '.join(f'`{o}`' for o in r['overrides']) or '(run.sh)'} | {fmt(r['reward_first5'])} | "
                     f"{fmt(r['reward_last5'])} | {fmt(r['heldout_before'])} -> {fmt(r['heldout_after'])} | "
                     f"{r['logprob_gap_mean']:.2e} / {r['logprob_gap_max']:.2e} | {fmt(r['rollout_tok_s'], 1)} | "
                     f"{r['step_minutes']:.1f} |")
    (out / "precision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "summarize"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--out", default=str(HERE / "precision"))
    p.add_argument("--runs", default=str(OUTPUTS), help="the arms' output folders (summarize)")
    a = p.parse_args()
    arms = a.arms.split(",")
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        p.error(f"unknown arms {unknown}; available: {', '.join(ARMS)}")
    if a.command == "run":
        run(a.seed, arms)
    else:
        summarize(Path(a.out), arms, Path(a.runs))


if __name__ == "__main__":
    main()
