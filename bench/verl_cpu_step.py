"""Time per training step: verl's own trainer on the CPU vs verl_agentic.main_ppo, same experiment.

    .venv/bin/python bench/verl_cpu_step.py [--steps 4] [--out outputs/bench_verl_cpu_step]

Runs, one after the other in this script, the learning run's experiment (examples/learning_run: easy
word problems, retry feedback, GRPO, 4 prompts x 8 samples, 2 turns of 24 tokens, embedded SmolLM2-135M)
for ``--steps`` steps through

* ``main_ppo``: ``bash examples/learning_run/run.sh 0 trainer.total_steps=N`` (one process, no Ray);
* ``verl``: ``bash examples/learning_run_verl/run.sh 0 trainer.total_training_steps=N`` (verl's
  ``main_ppo``: Ray, FSDP2 over gloo, the hf rollout, weights pushed every step),

and prints the median seconds per step of each (step 1 left out: warm-up), their ratio, the wall clock
of each command (start-up included), and where verl's step spends its time (its ``timing_s/*``) beside
ours (``timing/*``). Run it on an otherwise idle machine: two trainers never run at once here, but any
other load skews both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], env: dict, log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}); see {log}")
    return time.perf_counter() - t0


def rows(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out.append({**r["data"], "step": r["step"]} if isinstance(r.get("data"), dict) else r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_verl_cpu_step")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"$ .venv/bin/python bench/verl_cpu_step.py --steps {a.steps}   (load before: {os.getloadavg()[0]:.2f})")
    py = {"PYTHON": sys.executable}
    ours_dir, verl_dir = a.out / "main_ppo", a.out / "verl"
    wall_ours = run(["bash", "examples/learning_run/run.sh", "0", f"trainer.total_steps={a.steps}",
                     f"output.dir={ours_dir}"], py, a.out / "main_ppo.log")
    wall_verl = run(["bash", "examples/learning_run_verl/run.sh", "0", f"trainer.total_training_steps={a.steps}"],
                    {**py, "OUT": str(verl_dir)}, a.out / "verl.log")
    ours = [r for r in rows(ours_dir / "metrics.jsonl") if "timing/step_s" in r]
    verl = [r for r in rows(verl_dir / "metrics.jsonl") if "timing_s/step" in r]
    s_ours = statistics.median(r["timing/step_s"] for r in ours[1:] or ours)
    s_verl = statistics.median(r["timing_s/step"] for r in verl[1:] or verl)
    print(f"seconds per step (median of steps 2..{a.steps}): main_ppo {s_ours:.1f}, verl {s_verl:.1f}, "
          f"verl/main_ppo {s_verl / s_ours:.2f}")
    print(f"wall clock of the whole command: main_ppo {wall_ours:.0f} s, verl {wall_verl:.0f} s")

    def breakdown(rs: list[dict], prefix: str) -> str:
        keys = sorted({k for r in rs for k in r if k.startswith(prefix) and isinstance(r[k], (int, float))})
        return ", ".join(f"{k.removeprefix(prefix)} {statistics.median(r[k] for r in rs[1:] or rs if k in r):.1f}"
                         for k in keys)

    print("main_ppo s/step: " + breakdown(ours, "timing/"))
    print("verl s/step:     " + breakdown(verl, "timing_s/"))
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
