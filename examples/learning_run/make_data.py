"""Write easy one-step word problems in GSM8K's format (``question`` / ``answer`` with ``#### N``).

The learning-run example trains on these: the 135M embedded model gets some right already, so
GRPO has signal from the first step on a 2-core CPU. ``python examples/learning_run/make_data.py``
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Maya", "Ben", "Zoe"]
THINGS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles"]


def problem(rng: random.Random) -> dict:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if rng.random() < 0.5:
        q = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
        ans = a + b
        sol = f"{name} has {a} + {b} = {ans} {thing}."
    else:
        a = a + b
        q = f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?"
        ans = a - b
        sol = f"{name} has {a} - {b} = {ans} {thing} left."
    return {"question": q, "answer": f"{sol}\n#### {ans}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).parent / "easy_arith.jsonl"))
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = [problem(rng) for _ in range(args.n)]
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} problems to {args.out}")


if __name__ == "__main__":
    main()
