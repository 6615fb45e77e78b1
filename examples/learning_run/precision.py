"""The learning run with a low-precision rollout: fp32 vs bf16 vs bf16 with rollout correction, pre-registered
(issue 38; PREREG.md, round 3, says what is compared and how it is read).

    .venv/bin/python examples/learning_run/precision.py run [--seeds 0,1,2] [--allow-dirty]   # ~10 min a run
    .venv/bin/python examples/learning_run/precision.py summarize [--out examples/learning_run/precision_prereg]

``run``: `examples/learning_run/run.sh SEED` (GRPO on easy word problems, 20 steps, the embedded SmolLM2)
once per arm and seed, the arms of each seed in a rotated order (seed 0: fp32, bf16, bf16_tis; seed 1:
bf16, bf16_tis, fp32; ...), one run after another. Every arm adds ``COMMON``; the arms differ only in
their named setting:

- ``fp32``: the rollout generates with the fp32 weights the trainer trains;
- ``bf16``: the rollout generates with a bf16 copy of the weights (``rollout.hf.weight_dtype=bfloat16``);
  the trainer (fp32) takes the old logprobs from its own forward and ignores the mismatch;
- ``bf16_tis``: ``bf16`` plus verl's token-level truncated importance sampling
  (``algorithm.rollout_correction.rollout_is=token``, threshold 2).

The old logprobs are the trainer's own in every arm (``actor.recompute_old_logprobs=true``): rollout
correction needs them, so the arms without it recompute them too, and the correction is the only
difference between ``bf16`` and ``bf16_tis``. Held-out accuracy is measured after each run, outside it,
in fp32 for every arm: greedy episodes of ``main_rollout`` on the 100 problems of ``heldout.jsonl`` with
the run's final weights (``hf_model/``, deleted afterwards), run.sh's task settings (``EVAL`` adds the
two that ``base_accuracy.RUN_SETTINGS`` lacks) and ``rollout.hf.weight_dtype=float32``;
the base model's once, the same way, as everyone's step 0. It refuses a checkout with uncommitted
changes and writes ``run_info.json`` (commit, command, exit status, wall clock, peak memory) and
``heldout_fp32.json`` beside each run in ``outputs/learning_run_precision/<arm>_seed<N>/``. A run that
crashes is a failed run, reported.

``summarize``: OUT/precision.json, OUT/precision.md and OUT/metrics/<arm>_seed<N>.* (each run's per-step
metrics, run_info.json and fp32 held-out result, unchanged): per run the reward of steps 1-5 and 16-20,
the fp32 held-out accuracy, the rollout-vs-trainer logprob gap and the correction's metrics; per arm the
mean and 95% interval; per pair of arms the difference paired by seed with its interval, ranked only
where the interval excludes 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from verl_agentic.jsonl import read_json_lines
from verl_agentic.provenance import DirtyTree, run_recorded, source_state
from verl_agentic.stats import mean_interval

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import base_accuracy  # noqa: E402  (the greedy episodes with run.sh's task settings)

HELDOUT = HERE / "heldout.jsonl"
COMMON = ["actor.recompute_old_logprobs=true", "trainer.save_hf_model=true"]
ARMS = {
    "fp32": [],
    "bf16": ["rollout.hf.weight_dtype=bfloat16"],
    "bf16_tis": ["rollout.hf.weight_dtype=bfloat16", "algorithm.rollout_correction.rollout_is=token",
                 "algorithm.rollout_correction.rollout_is_threshold=2.0"],
}
PAIRS = [("bf16", "fp32"), ("bf16_tis", "bf16"), ("bf16_tis", "fp32")]
# run.sh's settings that base_accuracy.RUN_SETTINGS (older than them) lacks: a turn cut at the cap has no answer
EVAL = ("task.gsm8k.answer_in_cut_turn=false", "reward.scorer_kwargs={gsm8k: {answer_in_cut_turn: false}}",
        "rollout.hf.weight_dtype=float32")
RUNS = REPO / "outputs" / "learning_run_precision"
OUT = HERE / "precision_prereg"


def order(seed: int, arms: list[str]) -> list[str]:
    """The arms of one seed, rotated by the seed: each arm runs first, second and third once in 3 seeds."""
    k = seed % len(arms)
    return arms[k:] + arms[:k]


def heldout_fp32(model: str, dest: Path) -> dict:
    """Greedy accuracy on the held-out problems in fp32, written to ``dest``: what every arm is judged by."""
    work = Path(tempfile.mkdtemp(prefix="precision-eval-"))
    try:
        trajs = base_accuracy.run(model, "greedy", 1, work, data=HELDOUT, extra=EVAL)
        tally = base_accuracy.tally(trajs, len(HELDOUT.read_text().splitlines()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"model": model, "data": HELDOUT.name, "overrides": list(EVAL), "episodes": tally["episodes"],
              "accuracy_final": tally["rates"]["final_correct"],
              "accuracy_first_turn": tally["rates"]["first_correct"]}
    dest.write_text(json.dumps(result, indent=1))
    return result


def run(seeds: list[int], arms: list[str], allow_dirty: bool, runs: Path = RUNS) -> int:
    state = source_state(allow_dirty)
    os.environ.setdefault("PYTHON", sys.executable)  # run.sh's interpreter: this one unless told
    base = runs / "base"
    base.mkdir(parents=True, exist_ok=True)
    print(f"== base model, fp32 held-out: {heldout_fp32('embedded', base / 'heldout_fp32.json')}", flush=True)
    failed = 0
    for seed in seeds:
        for arm in order(seed, arms):
            out = runs / f"{arm}_seed{seed}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = ["bash", "examples/learning_run/run.sh", str(seed), *COMMON, *ARMS[arm], f"output.dir={out}"]
            print(f"== {arm} seed {seed}: {' '.join(cmd)}", flush=True)
            info = run_recorded(cmd, out, state, arm=arm, seed=seed)
            if info["exit_status"] == 0 and (out / "hf_model").is_dir():
                try:
                    held = heldout_fp32(str(out / "hf_model"), out / "heldout_fp32.json")
                    print(f"== {arm} seed {seed}: fp32 held-out {held['accuracy_final']:.2f}", flush=True)
                except (subprocess.CalledProcessError, RuntimeError) as e:  # the run stays, marked incomplete
                    (out / "heldout_fp32.json").write_text(json.dumps({"error": str(e)}))
                    print(f"== {arm} seed {seed}: the fp32 evaluation failed: {e}", flush=True)
                    failed += 1
                shutil.rmtree(out / "hf_model")  # 0.5 GB a run
            failed += info["exit_status"] != 0
            print(f"== {arm} seed {seed}: exit {info['exit_status']} after {info['wall_s'] / 60:.1f} min", flush=True)
    return 1 if failed else 0


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_result(folder: Path, base_accuracy_fp32: float | None) -> dict:
    """One run's row: reward first/last 5 steps, gain, fp32 held-out after (and its change from the base
    model's), logprob gap, the correction's metrics, wall clock and peak memory."""
    info, held = _read(folder / "run_info.json"), _read(folder / "heldout_fp32.json")
    metrics = folder / "metrics.jsonl"
    rows = read_json_lines(metrics, skip_torn=True) if metrics.is_file() else []
    steps = [r for r in rows if r.get("step", 0) >= 1 and "reward/mean" in r]
    complete = info.get("exit_status") == 0 and len(steps) == 20 and "accuracy_final" in held
    first5, last5 = _mean(steps[:5], "reward/mean"), _mean(steps[-5:], "reward/mean")
    after = held.get("accuracy_final") if complete else None
    arm, seed = folder.name.rsplit("_seed", 1)  # also for a run whose runner died before writing run_info.json
    return {
        "arm": arm, "seed": int(seed), "commit": info.get("commit"), "dirty": info.get("dirty"),
        "exit_status": info.get("exit_status"), "steps": len(steps), "complete": complete,
        "reward_first5": first5, "reward_last5": last5,
        "gain": (last5 - first5) if complete else None,
        "heldout_fp32_after": after,
        "heldout_fp32_change": (after - base_accuracy_fp32) if after is not None and base_accuracy_fp32 is not None else None,
        "logprob_gap_mean": _mean(steps, "actor/logprob_gap_mean"),
        "logprob_gap_max": max((r.get("actor/logprob_gap_max") or 0) for r in steps) if steps else None,
        "clip_ratio_last5": _mean(steps[-5:], "response_length/clip_ratio"),
        "rollout_corr": {k: _mean(steps, k) for k in sorted({k for r in steps for k in r})
                         if k.startswith("rollout_corr/") and any(s in k for s in ("is_mean", "is_max", "clip", "kl"))},
        "wall_min": round(info.get("wall_s", 0) / 60, 1), "max_rss_gb": info.get("max_rss_gb"),
        "reward_curve": [round(r["reward/mean"], 4) for r in steps],
    }


def paired(results: list[dict], a: str, b: str, key: str) -> dict:
    """``a`` minus ``b`` on ``key``, paired by seed over the seeds both completed: mean, 95% interval, and
    the ranking the pre-registration allows (``a`` / ``b`` above when the interval excludes 0, else none)."""
    by = {(r["arm"], r["seed"]): r[key] for r in results if r[key] is not None}
    seeds = sorted({s for (arm, s) in by if arm == a} & {s for (arm, s) in by if arm == b})
    diffs = [by[(a, s)] - by[(b, s)] for s in seeds]
    mean, low, high = mean_interval(diffs)
    ranked = None
    if low is not None and (low > 0 or high < 0):
        ranked = a if low > 0 else b
    return {"seeds": seeds, "differences": diffs, "mean": mean, "ci95": [low, high], "ranked_above": ranked}


def summarize(out: Path, runs: Path = RUNS, arms: list[str] = list(ARMS)) -> dict:
    base = _read(runs / "base" / "heldout_fp32.json")
    folders = sorted(p for p in runs.glob("*_seed*") if p.is_dir() and p.name.rsplit("_seed", 1)[0] in arms)
    if not folders:
        raise SystemExit(f"{runs}: no <arm>_seed<N>/ folders (run first)")
    results = [run_result(f, base.get("accuracy_final")) for f in folders]
    results.sort(key=lambda r: (arms.index(r["arm"]), r["seed"]))
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    for f in folders:
        for name in ("metrics.jsonl", "run_info.json", "heldout_fp32.json"):
            if (f / name).is_file():
                shutil.copyfile(f / name, out / "metrics" / f"{f.name}.{name}")
    if base:
        shutil.copyfile(runs / "base" / "heldout_fp32.json", out / "metrics" / "base.heldout_fp32.json")
    per_arm = {}
    for arm in arms:
        mine = [r for r in results if r["arm"] == arm]
        per_arm[arm] = {"overrides": ARMS[arm], "runs": len(mine), "complete": sum(r["complete"] for r in mine),
                        **{k: dict(zip(("mean", "low", "high"), mean_interval([r[k] for r in mine if r[k] is not None])))
                           for k in ("gain", "heldout_fp32_after", "logprob_gap_mean")}}
    comparisons = {f"{a} - {b}": {k: paired(results, a, b, k) for k in ("gain", "heldout_fp32_after")}
                   for a, b in PAIRS if a in arms and b in arms}
    commits = sorted({r["commit"] for r in results if r["commit"]})
    summary = {"commits": commits, "common": COMMON, "base_heldout_fp32": base.get("accuracy_final"),
               "arms": per_arm, "comparisons": comparisons, "runs": results}
    (out / "precision.json").write_text(json.dumps(summary, indent=1))
    lines = _table(summary)
    (out / "precision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return summary


def _fmt(x, p: int = 3, sign: bool = False) -> str:
    return "-" if x is None else f"{x:+.{p}f}" if sign else f"{x:.{p}f}"


def _ci(d: dict, p: int = 3) -> str:
    return f"{_fmt(d['mean'], p, True)} [{_fmt(d['low'], p, True)}, {_fmt(d['high'], p, True)}]"


def _table(s: dict) -> list[str]:
    base = s["base_heldout_fp32"]
    lines = [f"Commit {', '.join(c[:7] for c in s['commits']) or '?'}; every arm with {' '.join(f'`{c}`' for c in s['common'])}; "
             f"held-out greedy accuracy in fp32 (100 problems), base model {_fmt(base, 2)}.", "",
             "| arm | seed | reward steps 1-5 | steps 16-20 | gain | held-out fp32 after | logprob gap mean / max | "
             "IS weight mean | turns cut (last 5) | wall | peak RSS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in s["runs"]:
        status = "" if r["exit_status"] == 0 else f" (exit {r['exit_status']})"
        gap = "-" if r["logprob_gap_mean"] is None else f"{r['logprob_gap_mean']:.1e} / {r['logprob_gap_max']:.1e}"
        lines.append(f"| {r['arm']}{status} | {r['seed']} | {_fmt(r['reward_first5'], 2)} | {_fmt(r['reward_last5'], 2)} | "
                     f"{_fmt(r['gain'], 3, True)} | {_fmt(r['heldout_fp32_after'], 2)} | {gap} | "
                     f"{_fmt(r['rollout_corr'].get('rollout_corr/rollout_is_mean'), 3)} | {_fmt(r['clip_ratio_last5'], 2)} | "
                     f"{r['wall_min']} min | {r['max_rss_gb']} GB |")
    lines += ["", "| arm | overrides | runs complete | gain, mean [95% interval] | held-out fp32 after |",
              "| --- | --- | --- | --- | --- |"]
    for arm, a in s["arms"].items():
        lines.append(f"| {arm} | {' '.join(f'`{o}`' for o in a['overrides']) or '(none)'} | {a['complete']} of {a['runs']} | "
                     f"{_ci(a['gain'])} | {_ci(a['heldout_fp32_after'], 2)} |")
    lines += ["", "| paired by seed | gain difference [95% interval] | ranks | held-out fp32 difference | ranks |",
              "| --- | --- | --- | --- | --- |"]
    for name, c in s["comparisons"].items():
        g, h = c["gain"], c["heldout_fp32_after"]
        lines.append(f"| {name} (seeds {','.join(map(str, g['seeds']))}) | "
                     f"{_ci(dict(zip(('mean', 'low', 'high'), (g['mean'], *g['ci95']))))} | {g['ranked_above'] or 'not ranked'} | "
                     f"{_ci(dict(zip(('mean', 'low', 'high'), (h['mean'], *h['ci95']))), 2)} | {h['ranked_above'] or 'not ranked'} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "summarize"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--allow-dirty", action="store_true")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--runs", default=str(RUNS), help="the runs' output folders")
    a = p.parse_args()
    arms = a.arms.split(",")
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        p.error(f"unknown arms {unknown}; available: {', '.join(ARMS)}")
    try:
        if a.command == "run":
            sys.exit(run([int(s) for s in a.seeds.split(",")], arms, a.allow_dirty, Path(a.runs)))
        summarize(Path(a.out), Path(a.runs), arms)
    except DirtyTree as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
