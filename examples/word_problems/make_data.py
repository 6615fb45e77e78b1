"""GSM8K-style word problems of graded difficulty (1, 2 or 3 arithmetic operations), seeded, in two
disjoint splits: ``train.jsonl`` and ``heldout.jsonl`` (no question text in both). ``train_hash.jsonl``
and ``heldout_hash.jsonl`` are the same problems asking for the answer after ``####`` (for the
strict-extraction and format-penalty experiment: strict extraction reads only ``#### N``), with an
example answer; ``*_hash_noex.jsonl`` ask the same without the example.

Rows are the gsm8k preprocessor's output (``PREPROCESS_DATASET["gsm8k"]``: prompt, ground truth,
extra_info) with a short-answer instruction, ``data_source: verl_agentic/word_problems`` (scored by the
gsm8k scorer, registered under that name too) and ``extra_info.ops`` = the number of operations.
Numbers are 2-9 and every intermediate result is a positive integer, so a 135M model has something
to learn at each level: the base model's accuracy per level is in ``base_accuracy.json``.

    python examples/word_problems/make_data.py        # rewrites train.jsonl and heldout.jsonl (same seed: same bytes)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).parent
DATA_SOURCE = "verl_agentic/word_problems"
INSTRUCTION = "Answer with the number only."
HASH_INSTRUCTION = 'Answer with "####" and the number, for example "#### 12".'
# The same without an example: the base model copies an example's number (8 of the 11 greedy
# held-out answers that write '#### N' give 12; format_probe.json), and strict extraction trained on
# that collapses onto it (DEVLOG, 2026-11-24 seventh session); without one, 21 write '#### N', none 12.
HASH_NOEX_INSTRUCTION = 'Answer with "####" and the number.'
NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Maya", "Ben", "Zoe", "Ivan", "Nia"]
THINGS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles", "stickers", "beads"]


def _n(rng: random.Random) -> int:
    return rng.randint(2, 9)


def problem(rng: random.Random, ops: int) -> dict:
    """One problem with ``ops`` operations: question, GSM8K-style worked answer (``#### N``)."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b, c, d = _n(rng), _n(rng), _n(rng), _n(rng)
    kind = rng.randrange(3)
    if ops == 1:
        if kind == 0:
            q, steps = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", [f"{a} + {b}"]
        elif kind == 1:
            a += b
            q, steps = f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?", [f"{a} - {b}"]
        else:
            q, steps = (f"{name} has {a} bags with {b} {thing} in each bag. How many {thing} does {name} have?",
                        [f"{a} * {b}"])
    elif ops == 2:
        if kind == 0:
            c = min(c, a + b - 1)
            q = f"{name} has {a} {thing}, gets {b} more and then gives away {c}. How many {thing} does {name} have now?"
            steps = [f"{a} + {b}", f"{{}} - {c}"]
        elif kind == 1:
            q = (f"{name} has {a} bags with {b} {thing} in each bag and {c} more {thing} outside the bags. "
                 f"How many {thing} does {name} have in all?")
            steps = [f"{a} * {b}", f"{{}} + {c}"]
        else:
            c = min(c, a * b - 1)
            q = (f"{name} has {a} bags with {b} {thing} in each bag and gives away {c} {thing}. "
                 f"How many {thing} does {name} have left?")
            steps = [f"{a} * {b}", f"{{}} - {c}"]
    elif ops == 3:
        if kind == 0:
            d = min(d, a * b + c - 1)
            q = (f"{name} has {a} bags with {b} {thing} in each bag, finds {c} more {thing} and then gives "
                 f"{d} {thing} to a friend. How many {thing} does {name} have now?")
            steps = [f"{a} * {b}", f"{{}} + {c}", f"{{}} - {d}"]
        elif kind == 1:
            c = min(c, a + b - 1)
            q = (f"{name} has {a} {thing}, gets {b} more, gives away {c} and then gets {d} more. "
                 f"How many {thing} does {name} have now?")
            steps = [f"{a} + {b}", f"{{}} - {c}", f"{{}} + {d}"]
        else:
            q = (f"{name} has {a} bags with {b} {thing} in each bag and {c} boxes with {d} {thing} in each box. "
                 f"How many {thing} does {name} have in all?")
            steps = [f"{a} * {b}", f"{c} * {d}", "{} + {}"]
    else:
        raise ValueError(f"ops must be 1, 2 or 3, got {ops}")
    lines, results = [], []
    for step in steps:  # "{}" stands for the previous results, in order
        holes = step.count("{}")
        expr = step.format(*results[len(results) - holes:]) if holes else step
        value = eval(expr, {"__builtins__": {}})  # noqa: S307 - our own arithmetic on integers
        assert isinstance(value, int) and value > 0, (expr, value)
        lines.append(f"{expr} = {value}")
        results.append(value)
    return {"question": q, "answer": ". ".join(lines) + f".\n#### {results[-1]}", "ops": ops}


def make_rows(problems: list[dict], instruction: str = INSTRUCTION) -> list[dict]:
    from verl_agentic.tasks.data import preprocess_row

    rows = []
    for i, raw in enumerate(problems):
        row = preprocess_row({"question": raw["question"], "answer": raw["answer"]}, i, "gsm8k")
        row["data_source"] = DATA_SOURCE
        row["prompt"] = [{"role": "user", "content": f"{raw['question']}\n{instruction}"}]
        row["extra_info"]["ops"] = raw["ops"]
        rows.append(row)
    return rows


def generate(seed: int, train_per_level: int, heldout_per_level: int) -> tuple[list[dict], list[dict]]:
    """(train, heldout) problems: per level, unique questions drawn with ``seed``; held-out ones first."""
    rng = random.Random(seed)
    train, heldout = [], []
    for ops in (1, 2, 3):
        seen: set[str] = set()
        pool: list[dict] = []
        while len(pool) < train_per_level + heldout_per_level:
            p = problem(rng, ops)
            if p["question"] not in seen:
                seen.add(p["question"])
                pool.append(p)
        heldout += pool[:heldout_per_level]
        train += pool[heldout_per_level:]
    random.Random(seed + 1).shuffle(train)
    return train, heldout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-per-level", type=int, default=400)
    ap.add_argument("--heldout-per-level", type=int, default=50)
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    train, heldout = generate(args.seed, args.train_per_level, args.heldout_per_level)
    out = Path(args.out)
    for name, problems in (("train", train), ("heldout", heldout)):
        for suffix, instruction in (("", INSTRUCTION), ("_hash", HASH_INSTRUCTION), ("_hash_noex", HASH_NOEX_INSTRUCTION)):
            rows = make_rows(problems, instruction)
            (out / f"{name}{suffix}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            print(f"wrote {len(rows)} problems to {out / f'{name}{suffix}.jsonl'}")


if __name__ == "__main__":
    main()
