"""Latency and throughput of the environment service (``verl_agentic.envserver``) over loopback HTTP.

The episodes are real ``gsm8k`` environments on GSM8K test rows with ``verify`` feedback, 3 turns at
most, driven through ``EnvClient`` as the ``gen_chat`` task drives them: ``/start``, ``/step`` with a
wrong answer (the service answers with the verify question), ``/step`` with the right answer (done),
``/end`` (reward 1, checked): 4 requests an episode. No model: what is timed is the service and its
client. Two measurements, each ``--rounds`` times (the table has the median round, and the range):

  sequential   one client, ``--episodes`` episodes one after the other -> ms per request
  concurrent   ``--episodes`` episodes at once, a client each           -> requests per second

By default the service runs in this process (``serve(EnvService())``, one event loop for the service
and its clients); ``--process`` starts ``python -m verl_agentic.envserver --port 0`` instead, as a
deployment would.

    .venv/bin/python bench/envserver_latency.py                 # 200 episodes, 3 rounds, in-process
    .venv/bin/python bench/envserver_latency.py --process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator

REPO = Path(__file__).resolve().parent.parent
TASK_CONFIG = {"feedback": "verify"}
REQUESTS_PER_EPISODE = 4


async def episode(client, row: dict, session_id: str) -> None:
    """One gsm8k episode over the protocol: wrong answer, verify question, right answer, end."""
    truth = row["reward_model"]["ground_truth"]
    start = await client.start("gsm8k", row, session_id=session_id, task_config=TASK_CONFIG, max_turns=3)
    sid = start["session_id"]
    wrong = await client.step(sid, 1, {"role": "assistant", "content": f"#### {truth}1"})
    assert not wrong["done"] and wrong["messages"][0]["role"] == "user", wrong
    right = await client.step(sid, 2, {"role": "assistant", "content": f"The answer is #### {truth}"})
    assert right["done"] and right["turn_reward"] == 1.0, right
    end = await client.end(sid, finish_reason="stop")
    assert end["reward"] == 1.0 and end["metrics"]["flips_wrong_to_right"] == 1.0, end


async def sequential(url: str, rows: list[dict], tag: str) -> float:
    """Seconds for all ``rows`` as episodes one after the other through one client."""
    from verl_agentic.envserver import EnvClient

    client = EnvClient(url)
    try:
        t0 = time.perf_counter()
        for i, row in enumerate(rows):
            await episode(client, row, f"{tag}-{i}")
        return time.perf_counter() - t0
    finally:
        await client.close()


async def concurrent(url: str, rows: list[dict], tag: str) -> float:
    """Seconds for all ``rows`` as episodes at once, each with its own client (connection pool)."""
    from verl_agentic.envserver import EnvClient

    clients = [EnvClient(url) for _ in rows]
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(episode(c, row, f"{tag}-{i}") for i, (c, row) in enumerate(zip(clients, rows))))
        return time.perf_counter() - t0
    finally:
        await asyncio.gather(*(c.close() for c in clients))


@contextlib.asynccontextmanager
async def service(in_process: bool) -> AsyncIterator[str]:
    """The service's URL: served in this event loop, or by ``python -m verl_agentic.envserver``."""
    if in_process:
        from verl_agentic.envserver import EnvService, serve

        async with serve(EnvService()) as url:
            yield url
        return
    proc = subprocess.Popen([sys.executable, "-m", "verl_agentic.envserver", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        if "listening on " not in line:
            raise RuntimeError(f"the environment service did not start (exit code {proc.poll()}): {line!r}")
        yield line.split("listening on ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--process", action="store_true", help="the service in its own process (default: this one)")
    args = ap.parse_args()
    if args.episodes < 1 or args.rounds < 1:
        ap.error("--episodes and --rounds must be >= 1")
    print("$ " + shlex.join([".venv/bin/python", "bench/" + Path(__file__).name, *sys.argv[1:]]), flush=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    import verl_agentic.tasks  # noqa: F401 - registers gsm8k and its dataset preprocessor
    from verl_agentic.tasks.data import load_rows

    data = load_rows(REPO / "data" / "gsm8k" / "test.jsonl", "gsm8k", args.episodes)
    rows = [data[i % len(data)] for i in range(args.episodes)]
    requests = REQUESTS_PER_EPISODE * len(rows)
    seq, conc = [], []
    async with service(not args.process) as url:
        await sequential(url, rows[:5], "warmup")
        for r in range(args.rounds):  # interleaved, so machine load hits both alike
            seq.append(await sequential(url, rows, f"seq{r}"))
            conc.append(await concurrent(url, rows, f"conc{r}"))

    where = "own process (python -m verl_agentic.envserver)" if args.process else "in-process"
    print(f"\n{len(rows)} gsm8k episodes x {REQUESTS_PER_EPISODE} requests, service {where}, {url}; "
          f"median of {args.rounds} rounds [min-max]; ms per request = wall / requests")
    print(f"| {'mode':42} | {'wall s':>18} | {'ms per request':>20} | {'requests/s':>20} |")
    print(f"| {'-' * 42} | {'-' * 18} | {'-' * 20} | {'-' * 20} |")
    for name, xs in (("sequential (1 client)", seq), (f"concurrent ({len(rows)} episodes, a client each)", conc)):
        med, lo, hi = statistics.median(xs), min(xs), max(xs)
        print(f"| {name:42} | {f'{med:.2f} [{lo:.2f}-{hi:.2f}]':>18} | "
              f"{f'{med / requests * 1e3:.2f} [{lo / requests * 1e3:.2f}-{hi / requests * 1e3:.2f}]':>20} | "
              f"{f'{requests / med:.0f} [{requests / hi:.0f}-{requests / lo:.0f}]':>20} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    asyncio.run(main())
