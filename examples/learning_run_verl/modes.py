"""verl's ``sync`` against its ``colocate_async`` trainer, on the learning run's experiment and batch.

    .venv/bin/python examples/learning_run_verl/modes.py run sync 0            # -> outputs/learning_run_verl/sync_seed0
    .venv/bin/python examples/learning_run_verl/modes.py run colocate_async 0  # -> outputs/learning_run_verl/colocate_async_seed0
    .venv/bin/python examples/learning_run_verl/modes.py summarize outputs/learning_run_verl/sync_seed0 \\
        outputs/learning_run_verl/colocate_async_seed0 --out examples/learning_run_verl/modes

``run MODE SEED [overrides]`` is ``examples/learning_run_verl/run.sh SEED trainer.v1.trainer_mode=MODE``
(the same data, task, feedback, reward, algorithm and batch: 4 prompts x 8 episodes a step, 2 turns of
at most 24 tokens, the embedded SmolLM2, our ``hf`` rollout) and records the run's wall time.

``summarize`` reads each run folder (verl's ``metrics.jsonl``, our trajectory dump with each episode's
timing and policy versions) and writes ``OUT/modes.json``, ``OUT/modes.md`` (the table) and
``OUT/modes.png`` (reward per step, seconds per step), and copies each run's metrics to
``OUT/<run>.metrics.jsonl`` so the table can be recomputed from the repository. Per run:

- ``s/step``: verl's ``timing_s/step`` (mean); ``gen s``: its ``timing_s/gen``, the time the trainer
  waited for its batch; ``episodes/s``: episodes trained on per second of training;
- the episode lengths (generated tokens): median, 90th percentile, max; and the long tail of a
  step's generation: ``straggler share``, over the steps, the mean of (the last episode's end - the
  median episode's end) / (the last end - the first start) of the episodes a step trained on, i.e. the
  part of the generation phase spent waiting for the slowest half;
- staleness (verl's ``training/off_policy/*``): the mean trajectory staleness, the largest number of
  policy versions one trajectory spanned, the episodes that spanned a weight update;
- the reward: ``critic/score/mean``, first 5 and last 5 steps.
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

from verl_agentic.jsonl import read_json_lines

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODES = ("sync", "colocate_async")


def run(mode: str, seed: int, overrides: list[str]) -> Path:
    if mode not in MODES:
        sys.exit(f"modes.py: MODE must be one of {MODES}, got {mode!r}")
    out = REPO / "outputs" / "learning_run_verl" / f"{mode}_seed{seed}"
    if out.exists():
        shutil.rmtree(out)
    start = time.time()
    proc = subprocess.run(["bash", str(HERE / "run.sh"), str(seed), f"trainer.v1.trainer_mode={mode}", *overrides],
                          env={**os.environ, "OUT": str(out)}, cwd=REPO)
    (out / "run.json").write_text(json.dumps({"mode": mode, "seed": seed, "overrides": overrides,
                                              "wall_s": round(time.time() - start, 1), "exit": proc.returncode}))
    if proc.returncode != 0:
        sys.exit(f"modes.py: the {mode} run failed (exit {proc.returncode})")
    return out


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize_run(folder: Path) -> dict:
    steps: dict[int, dict] = {}
    for line in read_json_lines(folder / "metrics.jsonl", what="a step's metrics"):
        steps.setdefault(int(line["step"]), {}).update(line["data"])
    trained = {s: m for s, m in sorted(steps.items()) if "timing_s/step" in m}
    episodes = [e for f in sorted((folder / "rollouts").glob("step_*.jsonl")) for e in read_json_lines(f)]
    lengths = [sum(e["response_mask"]) for e in episodes]
    # episodes by the step that trained on them: verl's dump is keyed by the oldest policy version,
    # so group by the version and match each group to the step that followed it
    by_version: dict[int, list[dict]] = {}
    for e in episodes:
        by_version.setdefault(int(e["step"]), []).append(e)
    shares = []
    for group in by_version.values():
        timed = [e["timing"] for e in group if "timing" in e]
        if len(timed) < 2:
            continue
        ends = sorted(t["end"] for t in timed)
        first, last = min(t["start"] for t in timed), ends[-1]
        if last > first:
            shares.append((last - statistics.median(ends)) / (last - first))
    rewards = [m.get("critic/score/mean", 0.0) for m in trained.values()]
    # episodes trained a step: colocate_async rolls two batches out with one policy version, so a
    # version's group is not a step's batch; the dump holds every trained episode once
    batch = len(episodes) / max(1, len(trained))
    spanning = [e for e in episodes if (e.get("policy_versions") or {}).get("max") is not None
                and e["policy_versions"]["max"] > e["policy_versions"]["min"]]
    run_info = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
    mean = lambda key: round(statistics.mean(m[key] for m in trained.values() if key in m), 3) if any(  # noqa: E731
        key in m for m in trained.values()) else None
    return {
        "run": folder.name, "mode": run_info.get("mode"), "steps": len(trained), "wall_s": run_info.get("wall_s"),
        "step_s": mean("timing_s/step"), "gen_s": mean("timing_s/gen"), "update_s": mean("timing_s/update_actor"),
        "episodes_per_step": round(batch, 1),
        "episodes_per_s": round(batch / statistics.mean(m["timing_s/step"] for m in trained.values()), 3),
        "length_p50": _percentile(lengths, 0.5), "length_p90": _percentile(lengths, 0.9), "length_max": max(lengths),
        "straggler_share": round(statistics.mean(shares), 3) if shares else None,
        "staleness_mean": mean("training/off_policy/trajectory_staleness/mean"),
        "spans_max": max((m.get("training/off_policy/trajectory_spans/max", 1) for m in trained.values()), default=None),
        "spanning_episodes": len(spanning), "episodes": len(episodes),
        "reward_first5": round(statistics.mean(rewards[:5]), 3), "reward_last5": round(statistics.mean(rewards[-5:]), 3),
        "reward_per_step": [round(r, 4) for r in rewards],
        "step_s_per_step": [round(m["timing_s/step"], 1) for m in trained.values()],
    }


COLUMNS = ("mode", "steps", "step_s", "gen_s", "update_s", "episodes_per_s", "length_p50", "length_p90", "length_max",
           "straggler_share", "staleness_mean", "spans_max", "spanning_episodes", "reward_first5", "reward_last5")


def summarize(folders: list[Path], out: Path) -> list[dict]:
    rows = [summarize_run(f) for f in folders]
    out.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        shutil.copy(folder / "metrics.jsonl", out / f"{folder.name}.metrics.jsonl")
    (out / "modes.json").write_text(json.dumps(rows, indent=1))
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    table += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    (out / "modes.md").write_text("\n".join(table) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for r in rows:
        a.plot(range(1, len(r["reward_per_step"]) + 1), r["reward_per_step"], marker="o", ms=3, label=r["mode"])
        b.plot(range(1, len(r["step_s_per_step"]) + 1), r["step_s_per_step"], marker="o", ms=3, label=r["mode"])
    a.set(xlabel="step", ylabel="reward (critic/score/mean)", title="reward per step")
    b.set(xlabel="step", ylabel="seconds", title="wall time per step")
    a.legend()
    fig.tight_layout()
    fig.savefig(out / "modes.png", dpi=110)
    print("\n".join(table))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("mode")
    r.add_argument("seed", type=int)
    r.add_argument("overrides", nargs="*")
    s = sub.add_parser("summarize")
    s.add_argument("runs", nargs="+", type=Path)
    s.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.command == "run":
        run(args.mode, args.seed, args.overrides)
    else:
        summarize(args.runs, args.out)


if __name__ == "__main__":
    main()
