"""The base model's accuracy on the learning run's problems, greedy and at temperature 1.

    .venv/bin/python examples/learning_run/base_accuracy.py [--model embedded] [--samples 4]

Runs ``python -m verl_agentic.main_rollout`` on ``easy_arith.jsonl`` with ``run.sh``'s task settings
of 2026-11-24 (gsm8k task, ``retry`` feedback with the run's retry message, flexible extraction, 2
assistant turns of at most 24 tokens; not today's ``answer_in_cut_turn=false``, which precision.py adds), once greedy (one episode a problem) and once at temperature 1, the run's
sampling temperature (``--samples`` episodes a problem, seed 0). Writes ``base_accuracy.json``: the
model, the commit (``git describe --always --dirty``), the settings and, per mode, the episode
counts of first-turn correct, final correct, wrong-to-right flips and answered, their rates, and
per problem (in row order) how many of its episodes were first-turn / finally correct; prints the
table. ``tests/test_learning_run_example.py`` checks the json against itself, the data, ``run.sh``
and the README's quote.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parent.parent
DATA = HERE / "easy_arith.jsonl"
RETRY = "That is not right. Try again. Answer with the number only."
# run.sh's settings that decide what an episode is (tests/test_learning_run_example.py checks each is in run.sh)
RUN_SETTINGS = ["task_type=gsm8k", "task.gsm8k.feedback=retry", "task.gsm8k.extraction=flexible",
                f"task.gsm8k.retry_message='{RETRY}'", "rollout.max_turns=2", "rollout.max_new_tokens=24",
                "rollout.max_total_tokens=512", "reward.manager=naive"]
SETTINGS = RUN_SETTINGS + ["data.max_samples=-1"]
KEYS = ("first_correct", "final_correct", "flips_wrong_to_right", "answered")


def mode_args(mode: str, samples: int) -> list[str]:
    if mode == "greedy":
        return ["rollout.temperature=0", "rollout.n=1"]
    return ["rollout.temperature=1.0", f"rollout.n={samples}", "seed=0"]


def run(model: str, mode: str, samples: int, work: Path, data: Path = DATA, extra: tuple[str, ...] = ()) -> list[dict]:
    """The episodes' trajectories of one ``main_rollout`` run over the whole data file (``extra``: more
    overrides, e.g. the precision comparison's ``rollout.hf.weight_dtype=float32``)."""
    out = work / mode
    subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", f"model.path={model}", f"data.path={data}",
                    *SETTINGS, *mode_args(mode, samples), *extra, f"output.dir={out}", "output.quiet=true"],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def tally(trajectories: list[dict], problems: int) -> dict:
    """Counts and rates of ``KEYS`` over the episodes, and each problem's first-turn / final correct count."""
    errors = [t["error"] for t in trajectories if t["error"] is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} episodes failed, e.g. {errors[0]}")
    counts = {k: int(sum(t["metrics"][k] for t in trajectories)) for k in KEYS}
    first, final = [0] * problems, [0] * problems
    for t in trajectories:
        first[t["index"]] += int(t["metrics"]["first_correct"])
        final[t["index"]] += int(t["metrics"]["final_correct"])
    n = len(trajectories)
    return {"episodes": n, "counts": counts, "rates": {k: counts[k] / n for k in KEYS},
            "first_correct_by_problem": first, "final_correct_by_problem": final}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--samples", type=int, default=4, help="episodes a problem at temperature 1")
    args = ap.parse_args()
    problems = len(DATA.read_text().splitlines())
    work = Path(tempfile.mkdtemp(prefix="learning-run-base-"))
    result, walls = {}, {}
    for mode, samples in (("greedy", 1), ("temperature_1", args.samples)):
        t0 = time.perf_counter()
        result[mode] = {"args": mode_args(mode, samples), **tally(run(args.model, mode, samples, work), problems)}
        walls[mode] = time.perf_counter() - t0
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    (HERE / "base_accuracy.json").write_text(json.dumps(
        {"model": args.model, "commit": commit, "data": DATA.name, "problems": problems, "settings": SETTINGS,
         "samples_at_t1": args.samples, "modes": result}, indent=1) + "\n")
    print(f"model {args.model}, {problems} problems of {DATA.name}, retry feedback, 2 turns x 24 tokens "
          f"(commit {commit})")
    print("| mode | episodes | first-turn acc | final acc | wrong->right | answered | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, m in result.items():
        r = m["rates"]
        print(f"| {mode} | {m['episodes']} | {r['first_correct']:.3f} | {r['final_correct']:.3f} | "
              f"{r['flips_wrong_to_right']:.3f} | {r['answered']:.3f} | {walls[mode]:.0f} |")


if __name__ == "__main__":
    main()
