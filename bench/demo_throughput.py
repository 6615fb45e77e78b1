"""`make demo`'s rollout, generated tokens/s: this tree vs a baseline commit, alternating in one script.

    .venv/bin/python bench/demo_throughput.py --baseline b54bde9 [--repeats 1] [--args "rollout.max_turns=3 ..."]

The baseline's ``verl_agentic`` is exported with ``git archive`` into a temporary folder and put first on
``PYTHONPATH``; everything else (venv, model, data, config) is shared. Each run is ``python -m
verl_agentic.main_rollout`` with the Makefile's ``DEMO_ARGS`` (8 GSM8K problems, 3 turns x 192 tokens,
temperature 0.7) in a fresh process; the figure is the summary's ``generated_tokens_per_s`` (generated
tokens / rollout wall time, model loading excluded). Runs alternate baseline, current, baseline, ...
For the current tree it also prints the engine's counters: decode steps (at least the longest episode's
generated tokens: the critical path), their mean batch and time, and the prefill work.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO_ARGS = "data.max_samples=8 rollout.n=1 rollout.max_turns=3 rollout.max_new_tokens=192"


def run(pythonpath: str | None, args: list[str], out: Path) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", *args, f"output.dir={out}", "output.quiet=true"],
                   check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "summary.json").read_text())
    task = summary["tasks"]["gsm8k"]
    return {"tok_s": task["generated_tokens_per_s"], "tokens": task["generated_tokens"], "wall_s": task["wall_s"],
            "backend": summary.get("backend", {})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="a commit whose verl_agentic is the baseline")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--args", default=DEMO_ARGS, help=f"main_rollout overrides (default: {DEMO_ARGS})")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    base = work / "baseline"
    base.mkdir()
    archive = subprocess.run(["git", "archive", a.baseline, "verl_agentic"], cwd=REPO, check=True, capture_output=True).stdout
    (work / "b.tar").write_bytes(archive)
    with tarfile.open(work / "b.tar") as t:
        t.extractall(base, filter="data")
    args = shlex.split(a.args)
    rows = []
    for i in range(a.repeats):
        for name, path in (("baseline", str(base)), ("current", None)):
            r = run(path, args, work / f"{name}{i}")
            rows.append((name, r))
            print(f"{name} run {i}: {r['tokens']:.0f} tokens in {r['wall_s']:.1f} s = {r['tok_s']:.1f} tok/s", file=sys.stderr)
    mean = {n: sum(r["tok_s"] for m, r in rows if m == n) / a.repeats for n in ("baseline", "current")}
    print(f"main_rollout {a.args}; baseline {a.baseline}; load average {os.getloadavg()[0]:.2f}")
    print("| tree | generated tok/s (mean of runs) | runs |")
    print("| --- | --- | --- |")
    for n in ("baseline", "current"):
        runs = ", ".join(f"{r['tok_s']:.1f}" for m, r in rows if m == n)
        print(f"| {n} | {mean[n]:.1f} | {runs} |")
    print(f"current / baseline: {mean['current'] / mean['baseline']:.2f}")
    for m, r in rows:  # the engine's own counters (the baseline's backend has no decode_s)
        s = r["backend"]
        if m == "current" and s.get("decode_steps"):
            print(f"current engine: {s['decode_steps']} decode steps at mean batch {s['mean_batch_size']:.2f}, "
                  f"{1e3 * s['decode_s'] / s['decode_steps']:.1f} ms each = {s['decode_s']:.1f} s of {r['wall_s']:.1f} s; "
                  f"{s['batches']} prefill passes, {s['prefill_tokens']} tokens prefilled, {s['cached_tokens']} reused")


if __name__ == "__main__":
    main()
