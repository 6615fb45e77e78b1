"""Write easy one-step word problems as preprocessed ``gsm8k`` rows with a short-answer prompt.

The learning-run example trains on these: the 135M embedded model gets some right already (it
does not follow GSM8K's "####" instruction at all), so GRPO has signal from the first step on a
2-core CPU. Rows are the gsm8k preprocessor's output (``PREPROCESS_DATASET["gsm8k"]``: ground
truth, extra_info) with the instruction replaced by ``INSTRUCTION`` and ``data_source:
verl_agentic/easy_arith`` (until 2026-11-24 the rows said ``openai/gsm8k``: same scorer, same runs).

    python examples/learning_run/make_data.py            # -> examples/learning_run/easy_arith.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

INSTRUCTION = "Answer with the number only."
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
    from verl_agentic.tasks.data import preprocess_row

    rng = random.Random(args.seed)
    rows = []
    for i in range(args.n):
        raw = problem(rng)
        row = preprocess_row(raw, i, "gsm8k")
        row["data_source"] = "verl_agentic/easy_arith"  # synthetic, not GSM8K (the gsm8k scorer scores it)
        row["prompt"] = [{"role": "user", "content": f"{raw['question']}\n{INSTRUCTION}"}]
        rows.append(row)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} problems to {args.out}")


if __name__ == "__main__":
    main()
