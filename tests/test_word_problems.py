"""examples/word_problems: the generator makes the committed splits, they are sound, and the committed
base-model table is what the committed episodes say."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "word_problems"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"va_word_problems_{name}", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (EXAMPLE / f"{name}.jsonl").read_text().splitlines()]


def test_the_generator_writes_the_committed_splits(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, cwd=ROOT)
    for name in ("train", "heldout"):
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (EXAMPLE / f"{name}.jsonl").read_bytes(), name


def test_splits_are_disjoint_graded_and_their_answers_right():
    train, heldout = _rows("train"), _rows("heldout")
    for rows, per_level in ((train, 400), (heldout, 50)):
        assert [sum(r["extra_info"]["ops"] == k for r in rows) for k in (1, 2, 3)] == [per_level] * 3
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in heldout}
    for r in train + heldout:
        assert r["data_source"] == "verl_agentic/word_problems" and r["task_type"] == "gsm8k"
        steps = re.findall(r"([\d +*-]+) = (\d+)", r["extra_info"]["answer"])
        assert len(steps) == r["extra_info"]["ops"]
        for expr, value in steps:  # every step's arithmetic, and the last result is the ground truth
            assert eval(expr, {"__builtins__": {}}) == int(value) > 0  # noqa: S307 - digits and + - * only
        assert r["reward_model"]["ground_truth"] == steps[-1][1]


def test_the_gsm8k_scorer_scores_them_under_their_own_name():
    from verl_agentic.reward.base import RewardItem
    from verl_agentic.reward.scorers import import_scorer_modules, resolve_scorer, run_scorer

    import_scorer_modules([])  # the built-in scorers
    row = _rows("heldout")[0]
    item = RewardItem(solution_str=row["reward_model"]["ground_truth"], ground_truth=row["reward_model"]["ground_truth"],
                      data_source=row["data_source"], task_type="gsm8k", extra_info=row["extra_info"])
    assert resolve_scorer(item) == "verl_agentic/word_problems"
    assert run_scorer(item)[0] == 1.0
    assert run_scorer(RewardItem(**{**item.as_dict(), "solution_str": "12345"}))[0] == 0.0


def test_the_committed_base_table_is_what_the_committed_episodes_say():
    base = _load("base_accuracy")
    episodes = [json.loads(x) for x in (EXAMPLE / "base_episodes.jsonl").read_text().splitlines()]
    committed = json.loads((EXAMPLE / "base_accuracy.json").read_text())
    assert committed["table"] == base.table(episodes)  # floats survive JSON exactly
    greedy = [e for e in episodes if e["mode"] == "greedy"]
    sampled = [e for e in episodes if e["mode"] == "temperature_1"]
    assert len(greedy) == 150 and len({e["index"] for e in greedy}) == 150
    assert len(sampled) == 150 * committed["samples_at_t1"]
    heldout_ops = {r["extra_info"]["index"]: r["extra_info"]["ops"] for r in _rows("heldout")}
    assert all(e["ops"] == heldout_ops[e["index"]] for e in episodes)
