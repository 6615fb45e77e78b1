"""Reward-manager throughput and hang tolerance, side by side in one run.

    .venv/bin/python bench/reward_managers.py [--n 10000] [--workers 2] [--timeout-s 2] [--hang-frac 0.01]

Inputs: N real GSM8K reference solutions from data/gsm8k/train.jsonl as responses, half scored
against their own answer and half against another row's (so half are right), with a CPU-heavy
scorer: ``gsm8k_symbolic`` (extraction + a sympy equality check, ~0.6 ms each; sympy keeps
per-process caches, so fresh processes are slower at first) or ``fixed_cpu_cost`` (the gsm8k
scorer plus a fixed busy loop of ``--cost-ms`` CPU time).

1. naive vs prime vs swedev (a reward server started on loopback, with the same worker count):
   samples/s, ratios prime/naive (target >= 1.8 on 2 cores) and swedev/prime (target >= 0.8),
   and a check that all three return identical results.
2. prime with ``hang_frac`` of the samples hanging forever (``time.sleep`` loop): wall time vs
   the no-hang wall time W and the timeout T. A hung sample cannot finish before T after it
   starts, and the last one starts near the end of the run, so ~W + T is the floor; the target
   is wall <= T + 1.2 W (the floor plus 20% of W).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # va_faulty_scorers: the hanging scorer

from verl_agentic.reward import RewardConfig, RewardItem, make_reward_manager  # noqa: E402
from verl_agentic.reward.compare import reward_server  # noqa: E402
from verl_agentic.tasks.gsm8k import ground_truth_from_solution  # noqa: E402


def load_items(n: int) -> list[RewardItem]:
    rows = [json.loads(line) for line in (REPO / "data/gsm8k/train.jsonl").read_text().splitlines() if line.strip()]
    items = []
    for i in range(n):
        row = rows[i % len(rows)]
        other = rows[(i * 7 + 3) % len(rows)]
        truth = ground_truth_from_solution((row if i % 2 == 0 else other)["answer"])
        items.append(RewardItem(row["answer"], truth, data_source="openai/gsm8k", task_type="gsm8k"))
    return items


def timed(cfg: dict, items: list[RewardItem], repeats: int) -> tuple[float, list, dict]:
    """Median wall time of ``repeats`` runs on one warmed-up manager (this VM's timings are noisy)."""
    walls = []
    with make_reward_manager(RewardConfig.from_dict(cfg)) as m:
        m.score_items(items[:64])  # warm up: processes, imports, connections
        for _ in range(repeats):
            t0 = time.perf_counter()
            results = m.score_items(items)
            walls.append(time.perf_counter() - t0)
        return sorted(walls)[len(walls) // 2], results, m.stats()


def _score_loop(items: list[RewardItem], scorer: str, cost_ms: float, seconds: float, out) -> None:
    from verl_agentic.reward.scorers import SCORERS

    fn = SCORERS[scorer]
    kwargs = {"cost_ms": cost_ms} if scorer == "fixed_cpu_cost" else {}
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        it = items[n % len(items)]
        fn(it.solution_str, it.ground_truth, None, **kwargs)
        n += 1
    out.put(n)


def parallel_ceiling(items: list[RewardItem], scorer: str, cost_ms: float, seconds: float = 3.0) -> float:
    """Samples scored by 2 independent processes in ``seconds`` over those of 1: what any pool can reach."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    counts = []
    for k in (1, 2):
        q = ctx.Queue()
        procs = [ctx.Process(target=_score_loop, args=(items, scorer, cost_ms, seconds, q)) for _ in range(k)]
        for p in procs:
            p.start()
        counts.append(sum(q.get() for _ in procs))
        for p in procs:
            p.join()
    return counts[1] / counts[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--hang-frac", type=float, default=0.01)
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    p.add_argument("--scorer", default="gsm8k_symbolic",
                   help="gsm8k_symbolic (sympy; per-process caches) or fixed_cpu_cost (gsm8k + a fixed CPU cost)")
    p.add_argument("--cost-ms", type=float, default=0.7, help="fixed_cpu_cost: CPU ms per sample")
    a = p.parse_args()
    print("command:", " ".join([".venv/bin/python", "bench/reward_managers.py", *sys.argv[1:]]))
    items = load_items(a.n)
    base = {"scorer": a.scorer, "num_workers": a.workers, "timeout_s": a.timeout_s,
            "scorer_modules": ["va_faulty_scorers"], "scorer_kwargs": {"fixed_cpu_cost": {"cost_ms": a.cost_ms}}}

    walls, results = {}, {}
    walls["naive"], results["naive"], _ = timed({**base, "manager": "naive", "timeout_s": None}, items, a.repeats)
    walls["prime"], results["prime"], prime_stats = timed({**base, "manager": "prime"}, items, a.repeats)
    with reward_server(a.workers, a.timeout_s, ["va_faulty_scorers"]) as url:
        walls["swedev"], results["swedev"], _ = timed({**base, "manager": "swedev", "url": url, "batch_size": 256},
                                                      items, a.repeats)
    ref = [r.as_dict() for r in results["naive"]]
    print(f"\n{a.n} samples, scorer {a.scorer}, {a.workers} workers")
    print(f"{'manager':8} {'wall s':>8} {'samples/s':>10} {'identical to naive':>19}")
    for name, w in walls.items():
        same = sum(x == y for x, y in zip(ref, (r.as_dict() for r in results[name])))
        print(f"{name:8} {w:8.2f} {a.n / w:10.0f} {same:>12}/{a.n}")
    print(f"prime/naive throughput: {walls['naive'] / walls['prime']:.2f}  (target >= 1.8)")
    print(f"swedev/prime throughput: {walls['prime'] / walls['swedev']:.2f}  (target >= 0.8)")
    print(f"prime pool: {json.dumps({k: v for k, v in prime_stats.items() if k.startswith('pool/')})}")
    ceiling = parallel_ceiling(items[:2000], a.scorer, a.cost_ms)
    print(f"this machine's ceiling: 2 processes scoring side by side do {ceiling:.2f}x the work of one")

    hang_items = list(items)
    step = int(round(1 / a.hang_frac))
    hung = list(range(step // 2, a.n, step))
    for i in hung:
        hang_items[i] = RewardItem("x", "1", scorer="faulty", extra_info={"fault": "hang"})
    hang_cfg = {**base, "manager": "prime", "scorer": None}
    for it in hang_items:
        if it.scorer is None:
            it.scorer = a.scorer
    w_hang, r_hang, stats = timed(hang_cfg, hang_items, a.repeats)
    w = walls["prime"]
    timeouts = sum(1 for r in r_hang if r.error and r.error.type == "timeout")
    others_ok = all(r_hang[i].as_dict() == ref[i] for i in range(a.n) if i not in set(hung))
    print(f"\nprime with {len(hung)} hanging samples ({a.hang_frac:.1%}), timeout {a.timeout_s} s:")
    print(f"  wall {w_hang:.2f} s; no-hang W {w:.2f} s; floor ~W+T {w + a.timeout_s:.2f} s; "
          f"target T+1.2W {a.timeout_s + 1.2 * w:.2f} s -> {'met' if w_hang <= a.timeout_s + 1.2 * w else 'MISSED'}")
    print(f"  {timeouts}/{len(hung)} hung samples got 'timeout'; all other results identical: {others_ok}")
    print(f"  pool: {json.dumps({k: v for k, v in stats.items() if k.startswith('pool/')})}")


if __name__ == "__main__":
    main()
