"""Start-up latency of the Python sandbox vs a plain subprocess, side by side.

Each round times, in turn (interleaved, so machine load hits every variant alike):
  plain          subprocess.run([python, "-c", "print(1)"])
  plain+flags    the same with the sandbox's interpreter flags (-E -s -B -u -X utf8)
  asyncio plain  asyncio.create_subprocess_exec of the same, output read, awaited
  sandbox        run_python("print(1)") with the default limits (rlimits, new session, dropped
                 capabilities, pids cgroup and network namespace where available, temp work dir)
  sandbox -net   the same with network=True (no network namespace)
  sandbox -net -cg  network=True and max_processes=None (no namespace, no cgroup)
and prints the median and p95 wall time of each (the caller's view: spawn to cleanup done) and
the ratio of medians to the plain subprocess.

    .venv/bin/python bench/sandbox_latency.py            # 50 rounds
    .venv/bin/python bench/sandbox_latency.py --runs 200
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from verl_agentic.tools.python_sandbox import SandboxLimits, run_python, sandbox_support

FLAGS = ["-E", "-s", "-B", "-u", "-X", "utf8"]


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    print("$ " + shlex.join([".venv/bin/python", "bench/" + Path(__file__).name, *sys.argv[1:]]), flush=True)
    print(f"python {sys.version.split()[0]} ({sys.executable}); sandbox support: {sandbox_support()}")

    py = sys.executable

    async def plain():
        r = subprocess.run([py, "-c", "print(1)"], capture_output=True)
        assert r.stdout == b"1\n"

    async def plain_flags():
        r = subprocess.run([py, *FLAGS, "-c", "print(1)"], capture_output=True)
        assert r.stdout == b"1\n"

    async def asyncio_plain():
        p = await asyncio.create_subprocess_exec(py, "-c", "print(1)", stdout=asyncio.subprocess.PIPE)
        out, _ = await p.communicate()
        assert out == b"1\n"

    def sandbox(limits: SandboxLimits):
        async def run():
            r = await run_python("print(1)", limits=limits)
            assert r.ok and r.stdout == "1\n", r
        return run

    variants = {
        "plain subprocess.run": plain,
        "plain + sandbox flags": plain_flags,
        "asyncio subprocess": asyncio_plain,
        "run_python (default)": sandbox(SandboxLimits()),
        "run_python network=True": sandbox(SandboxLimits(network=True)),
        "run_python no netns, no cgroup": sandbox(SandboxLimits(network=True, max_processes=None)),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.warmup + args.runs):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            await fn()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)

    base = statistics.median(times["plain subprocess.run"])
    print(f"\n{args.runs} runs each, interleaved; wall time per call in ms")
    print(f"| {'variant':32} | {'median':>7} | {'p95':>7} | {'ratio (median)':>14} |")
    print(f"| {'-' * 32} | {'-' * 7} | {'-' * 7} | {'-' * 14} |")
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"| {name:32} | {med * 1e3:7.1f} | {p95(xs) * 1e3:7.1f} | {med / base:14.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
