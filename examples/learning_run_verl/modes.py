"""verl's ``sync`` against its ``colocate_async`` trainer (and ``colocate_async`` with token-level rollout
importance sampling), on the learning run's experiment and batch.

    .venv/bin/python examples/learning_run_verl/modes.py series                     # PREREG_modes.md: 3 arms x seeds 0-2, 6 steps
    .venv/bin/python examples/learning_run_verl/modes.py summarize outputs/learning_run_verl/modes/*_seed* \\
        --out examples/learning_run_verl/modes
    .venv/bin/python examples/learning_run_verl/modes.py run colocate_async 0 trainer.total_training_steps=8  # one run

``run ARM SEED [overrides]`` is ``examples/learning_run_verl/run.sh SEED`` plus the arm's overrides (the same
data, task, feedback, reward, algorithm and batch: 4 prompts x 8 episodes a step, 2 turns of at most 24
tokens, the embedded SmolLM2, our ``hf`` rollout) into ``outputs/learning_run_verl/modes/ARM_seedSEED``, and
writes ``run.json`` beside it: the arm, the seed, the overrides, the commit, the exit status and the wall time.
The arms (``ARMS``):

- ``sync``: ``trainer.v1.trainer_mode=sync``;
- ``colocate_async``: ``trainer.v1.trainer_mode=colocate_async`` (the next batch is rolled out while a step
  trains; requests in flight at a weight update are aborted and resumed on the new weights);
- ``colocate_async_tis``: the same with ``algorithm.rollout_correction.rollout_is=token`` and
  ``rollout_is_threshold=2.0`` (truncated importance weights for the stale tokens).

``series``: the pre-registered runs (``PREREG_modes.md``), every arm for every seed, the arms' order rotated
from seed to seed (seed 0: A B C, seed 1: B C A, seed 2: C A B) so no arm always runs first. It refuses a
checkout with uncommitted changes (one line naming them; ``--allow-dirty`` marks the results instead). A run
that fails is a failed run in the table, not a dropped one.

``summarize`` reads each run folder (verl's ``metrics.jsonl``, our trajectory dump with each episode's timing
and policy versions) and writes into OUT: ``<run>.metrics.jsonl`` (verl's metrics, unchanged),
``<run>.episodes.jsonl`` (each trained episode in a few fields: its versions, timing, generated tokens and
how each assistant turn ended), ``<run>.run.json``; then ``modes.json``, ``modes.md`` (a row per run, a row
per arm: the mean over seeds with its 95% interval, and a row per comparison of PREREG_modes.md, paired by
seed: the ratio of seconds per step, the differences of mean reward and cut share, and what the criteria
say of them) and ``modes.png``.
Given OUT itself (``summarize OUT --out OUT``) it recomputes the same table from OUT's files. Per run:

- ``step_s``: verl's ``timing_s/step`` (mean over the steps); ``gen_s``: its ``timing_s/gen``, the time the
  trainer waited for its batch; ``episodes_per_s``: episodes trained on per second of training;
- the episode lengths (generated tokens): median, 90th percentile, max; ``straggler_share``: over the
  steps, the mean of (the last episode's end - the median episode's end) / (the last end - the first start)
  of the episodes one policy version rolled out, i.e. the part of the generation phase spent waiting for the
  slowest half; ``cut_share``: the assistant turns that ended at the 24-token cap (``finish_reason`` length),
  over all, and by the policy version an episode started on;
- staleness (verl's ``training/off_policy/*``): the mean trajectory staleness, the largest number of
  policy versions one trajectory spanned, the episodes that spanned a weight update; ``probs_gap``: verl's
  ``training/rollout_probs_diff_mean`` (mean |p_trainer - p_rollout| of the trained tokens, the rollout's
  staleness seen by the trainer); ``is_truncated``: with rollout correction, the share of tokens whose
  importance weight was truncated at the threshold (``rollout_corr/rollout_is_ratio_fraction_high``);
- the reward (``critic/score/mean``): each step, the mean over the steps, and the first half's and last half's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from verl_agentic.jsonl import read_json_lines  # noqa: E402
from verl_agentic.provenance import DirtyTree, source_state  # noqa: E402
from verl_agentic.stats import mean_interval, quantile  # noqa: E402

RUNS = REPO / "outputs" / "learning_run_verl" / "modes"
ARMS = {
    "sync": ["trainer.v1.trainer_mode=sync"],
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
    "colocate_async_tis": ["trainer.v1.trainer_mode=colocate_async", "algorithm.rollout_correction.rollout_is=token",
                           "algorithm.rollout_correction.rollout_is_threshold=2.0"],
}
SERIES_SEEDS = (0, 1, 2)
SERIES_STEPS = 6


def run(arm: str, seed: int, overrides: list[str], runs: Path = RUNS, state: dict | None = None) -> int:
    """One run of ``run.sh`` with the arm's overrides; its exit status (a failed run keeps its folder)."""
    if arm not in ARMS:
        sys.exit(f"modes.py: ARM must be one of {tuple(ARMS)}, got {arm!r}")
    out = runs / f"{arm}_seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = ["bash", str((HERE / "run.sh").relative_to(REPO)), str(seed), *ARMS[arm], *overrides]
    print(f"== {arm} seed {seed}: {' '.join(cmd)}", flush=True)
    start = time.time()
    proc = subprocess.run(cmd, env={**os.environ, "OUT": str(out)}, cwd=REPO)
    info = {"arm": arm, "seed": seed, "overrides": [*ARMS[arm], *overrides], "command": " ".join(cmd),
            **(state or source_state(allow_dirty=True)), "wall_s": round(time.time() - start, 1),
            "exit": proc.returncode}
    (out / "run.json").write_text(json.dumps(info, indent=1))
    print(f"== {arm} seed {seed}: exit {proc.returncode} after {info['wall_s'] / 60:.1f} min", flush=True)
    return proc.returncode


def series(seeds: list[int], steps: int, allow_dirty: bool, runs: Path = RUNS) -> int:
    """Every arm for every seed, the arms' order rotated by one each seed; 1 if any run failed."""
    try:
        state = source_state(allow_dirty)
    except DirtyTree as e:
        sys.exit(f"modes.py: {e}")
    arms = list(ARMS)
    failed = 0
    for i, seed in enumerate(seeds):
        for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
            failed += run(arm, seed, [f"trainer.total_training_steps={steps}"], runs, state) != 0
    return 1 if failed else 0


def compact(episode: dict) -> dict:
    """The fields of a dumped episode that the table reads."""
    versions = episode.get("policy_versions") or {}
    return {"step": int(episode["step"]), "generated": sum(episode["response_mask"]), "timing": episode.get("timing"),
            "versions": [versions.get("min"), versions.get("max")],
            "assistant_turns": [t.get("finish_reason") for t in episode.get("turns") or ()
                                if t.get("role") == "assistant" and t["end"] > t["start"]]}


def run_episodes(folder: Path) -> list[dict]:
    """A run folder's trained episodes (``rollouts/step_*.jsonl``), or a summary's ``<run>.episodes.jsonl``."""
    if (folder / "rollouts").is_dir():
        return [compact(e) for f in sorted((folder / "rollouts").glob("step_*.jsonl")) for e in read_json_lines(f)]
    saved = folder.parent / f"{folder.name}.episodes.jsonl"
    return read_json_lines(saved) if saved.is_file() else []


def _share(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 3) if flags else None


def summarize_run(folder: Path, metrics: Path | None = None, run_info: Path | None = None) -> dict:
    steps: dict[int, dict] = {}
    for line in read_json_lines(metrics or folder / "metrics.jsonl", what="a step's metrics"):
        steps.setdefault(int(line["step"]), {}).update(line["data"])
    trained = {s: m for s, m in sorted(steps.items()) if "timing_s/step" in m}
    episodes = run_episodes(folder)
    lengths = [e["generated"] for e in episodes]
    # episodes by the policy version they started on: verl's dump is keyed by it, and colocate_async rolls
    # two batches out with one version, so a version's group is not a step's batch
    by_version: dict[int, list[dict]] = {}
    for e in episodes:
        by_version.setdefault(e["step"], []).append(e)
    shares = []
    for group in by_version.values():
        timed = [e["timing"] for e in group if e.get("timing")]
        if len(timed) < 2:
            continue
        ends = sorted(t["end"] for t in timed)
        first, last = min(t["start"] for t in timed), ends[-1]
        if last > first:
            shares.append((last - statistics.median(ends)) / (last - first))
    rewards = [m.get("critic/score/mean", 0.0) for m in trained.values()]
    half = max(1, len(rewards) // 2)
    batch = len(episodes) / max(1, len(trained))  # the dump holds every trained episode once
    spanning = [e for e in episodes if None not in e["versions"] and e["versions"][1] > e["versions"][0]]
    info_file = run_info or folder / "run.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    mean = lambda key: round(statistics.mean(m[key] for m in trained.values() if key in m), 3) if any(  # noqa: E731
        key in m for m in trained.values()) else None
    step_s = [m["timing_s/step"] for m in trained.values()]
    return {
        "run": folder.name, "arm": info.get("arm", info.get("mode")), "seed": info.get("seed"),
        "commit": info.get("commit"), "dirty": info.get("dirty"), "exit": info.get("exit"),
        "steps": len(trained), "wall_s": info.get("wall_s"),
        "step_s": mean("timing_s/step"), "gen_s": mean("timing_s/gen"), "update_s": mean("timing_s/update_actor"),
        "episodes_per_step": round(batch, 1),
        "episodes_per_s": round(batch / statistics.mean(step_s), 3) if step_s else None,
        "length_p50": quantile(lengths, 0.5),
        "length_p90": quantile(lengths, 0.9), "length_max": max(lengths, default=None),
        "straggler_share": round(statistics.mean(shares), 3) if shares else None,
        "cut_share": _share([f == "length" for e in episodes for f in e["assistant_turns"]]),
        "cut_share_by_version": {v: _share([f == "length" for e in g for f in e["assistant_turns"]])
                                 for v, g in sorted(by_version.items())},
        "staleness_mean": mean("training/off_policy/trajectory_staleness/mean"),
        "probs_gap": mean("training/rollout_probs_diff_mean"),
        "is_truncated": mean("rollout_corr/rollout_is_ratio_fraction_high"),
        "spans_max": max((m.get("training/off_policy/trajectory_spans/max", 1) for m in trained.values()), default=None),
        "spanning_episodes": len(spanning), "episodes": len(episodes),
        "reward_mean": round(statistics.mean(rewards), 3) if rewards else None,
        "reward_first_half": round(statistics.mean(rewards[:half]), 3) if rewards else None,
        "reward_last_half": round(statistics.mean(rewards[-half:]), 3) if rewards else None,
        "reward_per_step": [round(r, 4) for r in rewards],
        "step_s_per_step": [round(s, 1) for s in step_s],
    }


def interval(values: list[float]) -> list[float | None]:
    """``[mean, low, high]``: the mean and its 95% interval (``verl_agentic.stats``; none under 2 values)."""
    return list(mean_interval(values, digits=3))


ARM_KEYS = ("step_s", "gen_s", "update_s", "cut_share", "spanning_episodes", "reward_mean")


def _complete(rows: list[dict]) -> list[dict]:
    """The runs that exited 0 and trained every step (a failed run is listed, not averaged)."""
    full = max((r["steps"] for r in rows), default=0)
    return [r for r in rows if r["exit"] in (0, None) and r["steps"] == full]


def summarize_arms(rows: list[dict]) -> list[dict]:
    """Per arm, over its complete runs: each key's mean and 95% interval."""
    ok = _complete(rows)
    return [{"arm": arm, "runs": sum(r["arm"] == arm for r in rows), "complete": sum(r["arm"] == arm for r in ok),
             **{k: interval([r[k] for r in ok if r["arm"] == arm and r[k] is not None]) for k in ARM_KEYS}}
            for arm in dict.fromkeys(r["arm"] for r in rows)]


# PREREG_modes.md's comparisons: each arm against its baseline, paired by seed
PAIRS = (("colocate_async", "sync"), ("colocate_async_tis", "sync"), ("colocate_async_tis", "colocate_async"))


def compare(rows: list[dict], pairs=PAIRS) -> list[dict]:
    """Per pair and seed (both runs complete): the ratio of seconds per step, the difference of the mean
    reward and of the cut share; the mean of each with its 95% interval, and PREREG's reading of it."""
    by = {(r["arm"], r["seed"]): r for r in _complete(rows)}
    out = []
    for arm, base in pairs:
        seeds = sorted(s for a, s in by if a == arm and (base, s) in by)
        if not seeds:
            continue
        ratio = interval([by[(arm, s)]["step_s"] / by[(base, s)]["step_s"] for s in seeds])
        reward = interval([by[(arm, s)]["reward_mean"] - by[(base, s)]["reward_mean"] for s in seeds])
        cut = [by[(arm, s)]["cut_share"] - by[(base, s)]["cut_share"] for s in seeds]
        out.append({"arm": arm, "baseline": base, "seeds": seeds, "step_s_ratio": ratio, "reward_mean_diff": reward,
                    "cut_share_diff": interval(cut), "cut_share_higher_in": sum(c > 0 for c in cut),
                    "speed": _reading(ratio, 1.0, ("faster", "slower")),
                    "reward": _reading(reward, 0.0, ("lower", "higher"))})
    return out


def _reading(iv: list, null: float, words: tuple[str, str]) -> str:
    """``words[0]`` if the whole 95% interval is below ``null``, ``words[1]`` if above, else not ranked."""
    if iv[1] is None:
        return "not ranked (one seed)"
    return words[0] if iv[2] < null else words[1] if iv[1] > null else "not ranked"


RUN_COLUMNS = ("arm", "seed", "exit", "steps", "step_s", "gen_s", "update_s", "episodes_per_s", "length_p50",
               "length_max", "straggler_share", "cut_share", "staleness_mean", "probs_gap", "is_truncated", "spans_max",
               "spanning_episodes", "reward_mean", "reward_first_half", "reward_last_half")


def _cell(v) -> str:
    if isinstance(v, list) and len(v) == 3:
        return "-" if v[0] is None else f"{v[0]}" if v[1] is None else f"{v[0]} [{v[1]}, {v[2]}]"
    return "-" if v is None else str(v)


def summarize(folders: list[Path], out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    if [f.resolve() for f in folders] == [out.resolve()]:  # OUT alone: its committed runs
        folders = [out / f.name.removesuffix(".run.json") for f in sorted(out.glob("*.run.json"))]
    rows = []
    for folder in folders:
        if folder.parent.resolve() == out.resolve():  # OUT's own files: recompute the committed table
            rows.append(summarize_run(folder, out / f"{folder.name}.metrics.jsonl", out / f"{folder.name}.run.json"))
            continue
        row = summarize_run(folder)
        rows.append(row)
        if (folder / "metrics.jsonl").is_file():
            shutil.copy(folder / "metrics.jsonl", out / f"{folder.name}.metrics.jsonl")
        if (folder / "run.json").is_file():
            shutil.copy(folder / "run.json", out / f"{folder.name}.run.json")
        (out / f"{folder.name}.episodes.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in run_episodes(folder)))
    arms, pairs = summarize_arms(rows), compare(rows)
    commits = sorted({r["commit"] for r in rows if r["commit"]})
    result = {"commits": commits, "runs": rows, "arms": arms, "comparisons": pairs}
    (out / "modes.json").write_text(json.dumps(result, indent=1))
    lines = [f"Commit {', '.join(c[:7] for c in commits) or '?'}; each arm: the mean over its complete runs "
             f"[95% interval, Student's t over seeds].", "",
             "| " + " | ".join(RUN_COLUMNS) + " |", "|" + " --- |" * len(RUN_COLUMNS)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in RUN_COLUMNS) + " |" for r in rows]
    arm_columns = ["arm", "runs", "complete", *ARM_KEYS]
    lines += ["", "| " + " | ".join(arm_columns) + " |", "|" + " --- |" * len(arm_columns)]
    lines += ["| " + " | ".join(_cell(a[c]) for c in arm_columns) + " |" for a in arms]
    pair_columns = ["arm", "baseline", "seeds", "step_s_ratio", "speed", "reward_mean_diff", "reward", "cut_share_diff",
                    "cut_share_higher_in"]
    lines += ["", "| " + " | ".join(pair_columns) + " |", "|" + " --- |" * len(pair_columns)]
    lines += ["| " + " | ".join(_cell(p[c]) if c != "seeds" else ", ".join(map(str, p[c])) for c in pair_columns)
              + " |" for p in pairs]
    (out / "modes.md").write_text("\n".join(lines) + "\n")
    _plot(rows, out / "modes.png")
    print("\n".join(lines))
    return result


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(dict.fromkeys(r["arm"] for r in rows), ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for r in rows:
        label = f"{r['arm']} seed {r['seed']}"
        a.plot(range(1, len(r["reward_per_step"]) + 1), r["reward_per_step"], marker="o", ms=3, label=label,
               color=colors[r["arm"]], alpha=0.8)
        b.plot(range(1, len(r["step_s_per_step"]) + 1), r["step_s_per_step"], marker="o", ms=3,
               color=colors[r["arm"]], alpha=0.8)
    a.set(xlabel="step", ylabel="reward (critic/score/mean)", title="reward per step")
    b.set(xlabel="step", ylabel="seconds", title="wall time per step")
    a.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("arm")
    r.add_argument("seed", type=int)
    r.add_argument("overrides", nargs="*")
    s = sub.add_parser("series")
    s.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=list(SERIES_SEEDS))
    s.add_argument("--steps", type=int, default=SERIES_STEPS)
    s.add_argument("--allow-dirty", action="store_true")
    m = sub.add_parser("summarize")
    m.add_argument("runs", nargs="+", type=Path)
    m.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.command == "run":
        sys.exit(run(args.arm, args.seed, args.overrides))
    if args.command == "series":
        sys.exit(series(args.seeds, args.steps, args.allow_dirty))
    summarize(args.runs, args.out)


if __name__ == "__main__":
    main()
