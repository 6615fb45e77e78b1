"""Does the base model copy the instruction's example answer? One greedy first turn per held-out problem.

    .venv/bin/python examples/word_problems/format_probe.py [--model embedded]

Runs ``python -m verl_agentic.main_rollout`` greedily, one assistant turn of at most 24 tokens, strict
extraction, on ``heldout_hash.jsonl`` (the instruction ends 'for example "#### 12"') and on
``heldout_hash_noex.jsonl`` (no example). Writes ``format_probe.json``: per variant, each answer's
``#### N`` number (or null when it writes none) and correctness, and the counts the DEVLOG quotes: how
many answers write ``#### N``, how many of those give the example's 12, how many are correct.
``tests/test_word_problems.py`` recomputes the counts from the answers.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parent.parent
VARIANTS = ("heldout_hash", "heldout_hash_noex")
SETTINGS = ["task_type=gsm8k", "task.gsm8k.feedback=none", "task.gsm8k.extraction=strict", "rollout.max_turns=1",
            "rollout.max_new_tokens=24", "rollout.max_total_tokens=512", "rollout.temperature=0", "rollout.n=1",
            "reward.manager=naive", "data.max_samples=-1"]
EXAMPLE_ANSWER = "12"


def counts(answers: list[dict]) -> dict:
    """What the DEVLOG quotes, from the per-problem answers."""
    written = [a["hash_answer"] for a in answers if a["hash_answer"] is not None]
    return {"problems": len(answers), "hash_format": len(written),
            "example_answer": sum(v == EXAMPLE_ANSWER for v in written),
            "correct": sum(a["correct"] for a in answers),
            "top_hash_answers": collections.Counter(written).most_common(3)}


def probe(model: str, variant: str, work: Path) -> list[dict]:
    from verl_agentic.tasks.gsm8k import extract_answer

    out = work / variant
    subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", f"model.path={model}",
                    f"data.path={HERE / (variant + '.jsonl')}", *SETTINGS, f"output.dir={out}", "output.quiet=true"],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    answers = []
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        if t["error"] is not None:
            raise RuntimeError(f"{variant} problem {t['index']}: {t['error']}")
        text = next(m["content"] for m in t["messages"] if m["role"] == "assistant")
        answers.append({"index": t["index"], "hash_answer": extract_answer(text, "strict"),
                        "correct": bool(t["metrics"]["final_correct"])})
    return sorted(answers, key=lambda a: a["index"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="format-probe-"))
    result = {v: probe(args.model, v, work) for v in VARIANTS}
    tallies = {v: counts(a) for v, a in result.items()}
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    (HERE / "format_probe.json").write_text(json.dumps(
        {"model": args.model, "commit": commit, "settings": SETTINGS,
         "variants": {v: {"counts": tallies[v], "answers": a} for v, a in result.items()}}, indent=1) + "\n")
    print(f"model {args.model}, greedy first turns, strict extraction (commit {commit})")
    print("| rows | problems | write '#### N' | of which '#### 12' | correct | top '####' answers |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for v, c in tallies.items():
        print(f"| {v} | {c['problems']} | {c['hash_format']} | {c['example_answer']} | {c['correct']} | "
              f"{c['top_hash_answers']} |")


if __name__ == "__main__":
    main()
