"""How long ``main_ppo`` takes to exit after SIGTERM, and what each step pays for crash safety.

    .venv/bin/python bench/stop_latency.py [--delays 0,1,2,3,4] [--rollout-delays 2] [--out /tmp/va-stop] [overrides ...]

Runs the learning run (``examples/learning_run/run.sh``: the embedded SmolLM2-135M, 32 episodes a
step, one optimizer step of two micro-batches of 16) once per trial, 3 steps, and sends SIGTERM into
step 2: ``--delays`` seconds after the first forward pass of its policy update (``tests/va_update_watch.py``
marks each; it does not slow them here), and ``--rollout-delays`` seconds after step 1's metrics row (in
step 2's rollout). Prints, per trial, the seconds from the signal to the process's exit, the exit code,
the checkpoint left, and step 1's ``timing/save_s`` (the crash-safety write of the boundary it began
from: step 0's, the weights without Adam's state yet) and ``timing/step_s``.

One trial at a time (each holds the learning run's memory); about a minute each on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def trial(out: Path, where: str, delay: float, overrides: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    marks = out.parent / f"{out.name}.updates"
    marks.unlink(missing_ok=True)
    env = dict(os.environ, PYTHON=sys.executable, VA_UPDATE_MARKS=str(marks),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    log = open(out.parent / f"{out.name}.log", "w")
    proc = subprocess.Popen(["bash", "examples/learning_run/run.sh", "0", "trainer.total_steps=3",
                             "imports=[va_update_watch]", "output.quiet=true", f"output.dir={out}", *overrides],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    metrics = out / "metrics.jsonl"
    while _count(metrics) < 1:  # step 1 recorded
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before step 1 was recorded: {log.name}")
        time.sleep(0.02)
    seen = _count(marks)
    if where == "update":
        while _count(marks) <= seen:  # step 2's update has begun
            if proc.poll() is not None:
                raise SystemExit(f"the run ended before step 2's update: {log.name}")
            time.sleep(0.005)
    time.sleep(delay)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(300)
    exit_s = time.monotonic() - t0
    step1 = json.loads(metrics.read_text().splitlines()[0])
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    return {"where": where, "delay_s": delay, "exit_s": round(exit_s, 2), "rc": rc, "checkpoints": left,
            "steps_logged": _count(metrics), "step1_save_s": round(step1.get("timing/save_s", float("nan")), 2),
            "step1_step_s": round(step1["timing/step_s"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delays", default="0,1,2,3,4", help="seconds after the update's first forward")
    ap.add_argument("--rollout-delays", default="2", help="seconds after step 1's metrics row (step 2's rollout)")
    ap.add_argument("--out", default="/tmp/va-stop")
    ap.add_argument("overrides", nargs="*", help="more hydra overrides for the run")
    args = ap.parse_args()
    plan = [("rollout", float(d)) for d in args.rollout_delays.split(",") if d] + \
           [("update", float(d)) for d in args.delays.split(",") if d]
    rows = []
    for i, (where, delay) in enumerate(plan):
        rows.append(trial(Path(args.out) / f"trial{i}", where, delay, args.overrides))
        print(json.dumps(rows[-1]), flush=True)
    worst = max(rows, key=lambda r: r["exit_s"])
    print(f"worst: {worst['exit_s']} s from SIGTERM to exit ({worst['where']}, +{worst['delay_s']} s)")


if __name__ == "__main__":
    main()
