"""The learning run's pre-registered seeds: run them, then summarise every one (PREREG.md says what and why).

    .venv/bin/python examples/learning_run/seeds.py run [--seeds 0,1,2,3,4] [--allow-dirty]   # 4-10 min a seed
    .venv/bin/python examples/learning_run/seeds.py summarize [--out examples/learning_run/prereg2]

``run``: ``bash examples/learning_run/run.sh SEED`` for each seed, one after another, with greedy validation
on the 100 held-out problems (``heldout.jsonl``) before the first step and every 10 steps, into
``outputs/learning_run/seed<N>/``. It refuses a checkout with uncommitted changes (one line naming them;
``--allow-dirty`` marks the results instead) and writes ``run_info.json`` beside each run: the commit, the
command, the exit status, the wall clock and the peak resident memory of the run's processes. A run that
crashes is a failed seed, not a dropped one.

``summarize``: ``OUT/seeds.json``, ``OUT/seeds.md`` (the table of every seed, with the commit) and
``OUT/metrics/seed<N>.jsonl`` (each run's per-step metrics, unchanged) with its ``run_info.json``. A seed meets the criterion when
its mean reward of steps 16-20 is at least 0.2 above that of steps 1-5, and its held-out greedy accuracy
after the last step is above its step-0 value. Exit status 0 when at least 4 of the seeds meet it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from verl_agentic.jsonl import read_json_lines
from verl_agentic.provenance import DirtyTree, run_recorded, source_state
from verl_agentic.stats import mean_interval

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
HELDOUT = HERE / "heldout.jsonl"
RUNS = REPO / "outputs" / "learning_run"
VALIDATION = [f"data.val_path={HELDOUT.relative_to(REPO)}", "trainer.test_freq=10"]
MIN_GAIN = 0.2


def run(seeds: list[int], allow_dirty: bool, runs: Path = RUNS, script: str = "examples/learning_run/run.sh") -> int:
    state = source_state(allow_dirty)
    os.environ.setdefault("PYTHON", sys.executable)  # run.sh's interpreter: this one unless told
    failed = 0
    for seed in seeds:
        out = runs / f"seed{seed}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cmd = ["bash", script, str(seed), *VALIDATION]
        print(f"== seed {seed}: {' '.join(cmd)}", flush=True)
        info = run_recorded(cmd, out, state, seed=seed)
        failed += info["exit_status"] != 0
        print(f"== seed {seed}: exit {info['exit_status']} after {info['wall_s'] / 60:.1f} min", flush=True)
    return 1 if failed else 0


def _mean(rows: list[dict], key: str):
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def seed_result(folder: Path) -> dict:
    info = json.loads((folder / "run_info.json").read_text()) if (folder / "run_info.json").is_file() else {}
    metrics = folder / "metrics.jsonl"
    rows = read_json_lines(metrics, skip_torn=True) if metrics.is_file() else []
    steps = [r for r in rows if r.get("step", 0) >= 1 and "reward/mean" in r]
    vals = [(r["step"], r["val/accuracy/final"]) for r in rows if "val/accuracy/final" in r]
    r = {"seed": info.get("seed", folder.name.removeprefix("seed")), "commit": info.get("commit"),
         "dirty": info.get("dirty"), "exit_status": info.get("exit_status"), "steps": len(steps),
         "reward_first5": _mean(steps[:5], "reward/mean"), "reward_last5": _mean(steps[-5:], "reward/mean"),
         "heldout": vals, "wall_min": round(info.get("wall_s", 0) / 60, 1), "max_rss_gb": info.get("max_rss_gb"),
         "clip_ratio_last5": _mean(steps[-5:], "response_length/clip_ratio"),
         "reward_curve": [round(s["reward/mean"], 4) for s in steps]}
    complete = info.get("exit_status") == 0 and len(steps) == 20 and len(vals) >= 2
    r["gain"] = (r["reward_last5"] - r["reward_first5"]) if complete else None
    r["heldout_before"], r["heldout_after"] = (vals[0][1], vals[-1][1]) if complete else (None, None)
    r["meets"] = bool(complete and r["gain"] >= MIN_GAIN and vals[-1][1] > vals[0][1])
    return r


def interval(values: list[float]) -> tuple[float, float, float]:
    """The mean and its 95% interval (``verl_agentic.stats``); NaN where undefined, as the table prints it."""
    return tuple(float("nan") if x is None else x for x in mean_interval(values))


def summarize(out: Path, runs: Path = RUNS) -> int:
    folders = sorted((p for p in runs.glob("seed*") if p.is_dir()), key=lambda p: int(p.name[4:]))
    if not folders:
        raise SystemExit(f"{runs}: no seed<N>/ folders (run first)")
    results = [seed_result(f) for f in folders]
    (out / "metrics").mkdir(parents=True, exist_ok=True)  # (makes OUT too)
    for f, r in zip(folders, results):
        if (f / "metrics.jsonl").is_file():
            shutil.copyfile(f / "metrics.jsonl", out / "metrics" / f"seed{r['seed']}.jsonl")
        if (f / "run_info.json").is_file():  # the commit, command and exit status: the table is recomputable
            shutil.copyfile(f / "run_info.json", out / "metrics" / f"seed{r['seed']}.run_info.json")
    gains = [r["gain"] if r["gain"] is not None else float("nan") for r in results]
    done = [g for g in gains if g == g]
    mean, low, high = interval(done) if done else (float("nan"),) * 3
    commits = sorted({r["commit"] for r in results if r["commit"]})
    summary = {"commits": commits, "criterion": f"gain >= {MIN_GAIN} and held-out after > before",
               "met": sum(r["meets"] for r in results), "seeds": len(results),
               "gain_mean": mean, "gain_95ci": [low, high], "runs": results}
    (out / "seeds.json").write_text(json.dumps(summary, indent=1))
    fmt = lambda x, p=3: "-" if x is None or x != x else f"{x:+.{p}f}" if p == 3 else f"{x:.{p}f}"  # noqa: E731
    lines = [f"Commit {', '.join(c[:7] for c in commits) or '?'}; criterion: reward gain (steps 16-20 minus 1-5) >= "
             f"+{MIN_GAIN} and held-out greedy accuracy after the last step above step 0's.", "",
             "| seed | reward steps 1-5 | steps 16-20 | gain | held-out step 0 -> 10 -> 20 | turns cut at the cap "
             "(last 5) | meets | wall | peak RSS |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        held = " -> ".join(f"{a:.2f}" for _, a in r["heldout"]) or "-"
        lines.append(f"| {r['seed']} | {fmt(r['reward_first5'], 2)} | {fmt(r['reward_last5'], 2)} | {fmt(r['gain'])} | "
                     f"{held} | {fmt(r['clip_ratio_last5'], 2)} | {'yes' if r['meets'] else 'no'}"
                     f"{'' if r['exit_status'] == 0 else ' (exit ' + str(r['exit_status']) + ')'} | "
                     f"{r['wall_min']} min | {r['max_rss_gb']} GB |")
    lines.append(f"\n{summary['met']} of {len(results)} seeds meet the criterion; mean gain {fmt(mean)} "
                 f"(95% interval {fmt(low)} to {fmt(high)}, Student's t over {len(done)} completed seeds).")
    (out / "seeds.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if summary["met"] >= 4 else 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "summarize"))
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--allow-dirty", action="store_true")
    # round 2 (lr 2e-5, PREREG.md); round 1's table stays in prereg/, the 2026-11-22 evidence beside them
    p.add_argument("--out", default=str(HERE / "prereg2"))
    p.add_argument("--runs", default=str(RUNS))
    a = p.parse_args()
    try:
        if a.command == "run":
            sys.exit(run([int(s) for s in a.seeds.split(",")], a.allow_dirty, Path(a.runs)))
        sys.exit(summarize(Path(a.out), Path(a.runs)))
    except DirtyTree as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
