"""Start-up latency and throughput of the Python sandbox vs a plain subprocess, side by side.

Each round times, in turn (interleaved, so machine load hits every variant alike):
  plain          subprocess.run([python, "-c", "print(1)"])
  plain+flags    the same with the sandbox's interpreter flags (-E -s -B -u -X utf8)
  asyncio plain  asyncio.create_subprocess_exec of the same, output read, awaited
  sandbox        run_python("print(1)") with the default limits (isolation: bwrap: user, PID,
                 mount, network, IPC, UTS, cgroup namespaces, read-only root; rlimits, pids
                 cgroup, temp work dir)
  sandbox -cg    the same with max_processes=None (no pids cgroup)
  none           isolation: none (the engine before bubblewrap: rlimits, pids cgroup, network
                 namespace, dropped capabilities)
  none -net -cg  isolation: none, network=True, max_processes=None
and prints the median and p95 wall time of each (the caller's view: spawn to cleanup done) and
the ratio of medians to the plain subprocess. Then (``--humaneval``, on by default) the wall time
of HumanEval's 164 canonical solutions, 4 at a time, through each ``isolation`` and through a
plain ``subprocess`` (4 threads), best of ``--humaneval-rounds``.

    .venv/bin/python bench/sandbox_latency.py            # 50 rounds
    .venv/bin/python bench/sandbox_latency.py --runs 200

Runs against older versions of the package too (``PYTHONPATH=<old checkout>``): variants its
``SandboxLimits`` cannot express are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

try:
    from verl_agentic.isolation import SandboxLimits, run_python, sandbox_support
except ImportError:  # before the isolation package (the baseline)
    from verl_agentic.tools.python_sandbox import SandboxLimits, run_python, sandbox_support

HUMANEVAL = Path(__file__).resolve().parent.parent / "data" / "humaneval" / "HumanEval.jsonl.gz"

FLAGS = ["-E", "-s", "-B", "-u", "-X", "utf8"]


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-humaneval", dest="humaneval", action="store_false")
    ap.add_argument("--humaneval-rounds", type=int, default=2)
    args = ap.parse_args()
    print("$ " + shlex.join([".venv/bin/python", "bench/" + Path(__file__).name, *sys.argv[1:]]), flush=True)
    print(f"python {sys.version.split()[0]} ({sys.executable}); sandbox support: {sandbox_support()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    fields = {f.name for f in dataclasses.fields(SandboxLimits)}

    def limits(**kw) -> SandboxLimits | None:
        if "isolation" in kw and "isolation" not in fields:
            if kw.pop("isolation") != "none":
                return None  # this version has no bwrap
        return SandboxLimits(**kw)

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
        "run_python bwrap, no cgroup": limits(isolation="bwrap", max_processes=None),
        "run_python isolation=none": limits(isolation="none"),
        "run_python none, no netns/cgroup": limits(isolation="none", network=True, max_processes=None),
    }
    variants = {k: v if callable(v) else sandbox(v) for k, v in variants.items() if v is not None}
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
    if args.humaneval:
        await humaneval(args.humaneval_rounds, limits)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


async def humaneval(rounds: int, limits) -> None:
    """HumanEval's 164 canonical solutions with their tests, 4 at a time: seconds for all, best of ``rounds``."""
    with gzip.open(HUMANEVAL, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    programs = [r["prompt"] + r["canonical_solution"] + "\n\n" + r["test"] + f"\n\ncheck({r['entry_point']})\n"
                for r in rows]

    def plain_one(code: str) -> bool:
        return subprocess.run([sys.executable, "-E", "-s", "-B", "-c", code], capture_output=True).returncode == 0

    async def plain_all() -> int:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return sum(pool.map(plain_one, programs))

    def sandboxed(lim: SandboxLimits):
        async def run_all() -> int:
            sem = asyncio.Semaphore(4)

            async def one(code: str) -> bool:
                async with sem:
                    return (await run_python(code, limits=lim)).ok
            return sum(await asyncio.gather(*(one(c) for c in programs)))
        return run_all

    variants = {"plain subprocess (4 threads)": plain_all, "run_python (default)": sandboxed(SandboxLimits())}
    none = limits(isolation="none")
    if "isolation" in {f.name for f in dataclasses.fields(SandboxLimits)}:
        variants["run_python isolation=none"] = sandboxed(none)
    best = {k: float("inf") for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            passed = await fn()
            best[name] = min(best[name], time.perf_counter() - t0)
            assert passed == len(programs), f"{name}: {passed}/{len(programs)} canonical solutions passed"
    print(f"\nHumanEval: {len(programs)} canonical solutions + tests, 4 at a time, best of {rounds}; seconds")
    print(f"| {'variant':32} | {'seconds':>7} | {'per program ms':>14} |")
    print(f"| {'-' * 32} | {'-' * 7} | {'-' * 14} |")
    for name, t in best.items():
        print(f"| {name:32} | {t:7.2f} | {t / len(programs) * 1e3:14.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
